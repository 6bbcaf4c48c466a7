package images

import (
	"context"
	"testing"
	"time"
)

// TestAssembleReproducible: the same binary and options make the same
// image, byte for byte; the image runs the binary as the non-root user,
// with its labels, on linux/<arch>, every timestamp the given time.
func TestAssembleReproducible(t *testing.T) {
	img := Image{Name: "atoll-edge", Package: "example.com/atoll-edge", Description: "test"}
	opts := Options{Version: "v1.2.3", Revision: "abc", Created: time.Unix(1700000000, 0), Arch: "amd64"}
	a, err := assemble(img, opts, []byte("binary"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := assemble(img, opts, []byte("binary"))
	if err != nil {
		t.Fatal(err)
	}
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("two builds of the same binary: %s and %s", da, db)
	}
	if c, _ := assemble(img, opts, []byte("another binary")); c != nil {
		if dc, _ := c.Digest(); dc == da {
			t.Error("another binary, the same digest")
		}
	}
	cf, err := a.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.Config.User != User || len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/atoll-edge" {
		t.Errorf("runs %v as %q", cf.Config.Entrypoint, cf.Config.User)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(opts.Created) {
		t.Errorf("os %s arch %s created %v", cf.OS, cf.Architecture, cf.Created)
	}
	for k, want := range map[string]string{"org.opencontainers.image.version": "v1.2.3", "org.opencontainers.image.revision": "abc",
		"org.opencontainers.image.title": "atoll-edge"} {
		if got := cf.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
}

// TestBuildTwice builds atoll-edge's image twice from these sources: the
// same digest.
func TestBuildTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds atoll-edge")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var edge Image
	for _, img := range All {
		if img.Name == "atoll-edge" {
			edge = img
		}
	}
	var digests []string
	for range 2 {
		img, err := Build(ctx, edge, Options{Version: "test"})
		if err != nil {
			t.Fatal(err)
		}
		d, err := img.Digest()
		if err != nil {
			t.Fatal(err)
		}
		digests = append(digests, d.String())
	}
	if digests[0] != digests[1] {
		t.Errorf("two builds of atoll-edge: %v", digests)
	}
}
