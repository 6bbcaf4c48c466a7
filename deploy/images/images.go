// Package images builds Atoll's container images without Docker: each is
// one static binary of services/ on an empty base, run as a non-root user,
// reproducibly (the same sources and Go toolchain give the same digest:
// binaries built with -trimpath and no build ID or VCS stamp, every
// timestamp fixed). `go tool task images` writes them to an OCI layout
// and pushes them to a registry when asked.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Repository is where the manifests of deploy/ pull the images from: a
// kustomize images: entry points an overlay at another registry.
const Repository = "ghcr.io/atoll-edge"

// Image is one image Atoll ships: the service of services/ it runs.
type Image struct {
	// Name is the image's and the binary's name (atoll-cloud).
	Name string
	// Package builds the binary.
	Package string
	// Title describes it (org.opencontainers.image.title, description).
	Description string
}

// All are the images deploy/ runs.
var All = []Image{
	{Name: "atoll-cloud", Package: "github.com/atoll-edge/atoll/services/atoll-cloud",
		Description: "Atoll's cloud side: health, grids, views, tunnel, webhooks and the embedded hub"},
	{Name: "atoll-edge", Package: "github.com/atoll-edge/atoll/services/atoll-edge",
		Description: "Atoll's edge agent: the node's NATS server, prober, voter, endpoints proxy and tunnel"},
}

// User is the user and group the images run as (the "nonroot" of
// distroless images): no name, no home, no shell.
const User = "65532:65532"

// Options tune a build.
type Options struct {
	// Version labels the images (org.opencontainers.image.version), e.g.
	// the output of git describe.
	Version string
	// Revision is the source commit (org.opencontainers.image.revision).
	Revision string
	// Created is every timestamp of the image: the commit's time keeps a
	// build reproducible. Zero: the Unix epoch.
	Created time.Time
	// Arch is the target architecture (GOARCH); empty: this machine's.
	Arch string
}

// Build compiles img's binary and makes its image.
func Build(ctx context.Context, img Image, opts Options) (v1.Image, error) {
	if opts.Arch == "" {
		opts.Arch = runtime.GOARCH
	}
	dir, err := os.MkdirTemp("", "atoll-image")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, img.Name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", bin, img.Package)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+opts.Arch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("images: build %s: %w\n%s", img.Name, err, out)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return assemble(img, opts, data)
}

// assemble makes the image of one binary: a single layer holding it at
// /<name> (and an empty /tmp), every timestamp opts.Created.
func assemble(img Image, opts Options, binary []byte) (v1.Image, error) {
	created := opts.Created.UTC()
	if created.IsZero() {
		created = time.Unix(0, 0).UTC()
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: created},
		{Name: img.Name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(binary)), ModTime: created},
	} {
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	if _, err := tw.Write(binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	out, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: created}, CreatedBy: "atoll deploy/images: " + img.Package}})
	if err != nil {
		return nil, err
	}
	labels := map[string]string{
		"org.opencontainers.image.title":       img.Name,
		"org.opencontainers.image.description": img.Description,
		"org.opencontainers.image.source":      "https://github.com/atoll-edge/atoll",
		"org.opencontainers.image.version":     opts.Version,
		"org.opencontainers.image.revision":    opts.Revision,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
	}
	cf, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", opts.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: []string{"/" + img.Name},
		User:       User,
		Env:        []string{"PATH=/"},
		WorkingDir: "/",
		Labels:     labels,
	}
	return mutate.ConfigFile(out, cf)
}
