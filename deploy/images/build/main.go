// Command build makes Atoll's images (deploy/images) and writes them to
// an OCI image layout, pushing them to a registry when asked:
//
//	go run ./deploy/images/build --out bin/images [--push REGISTRY [--insecure]] [--tag TAG]
//
// go tool task images runs it with the version and time of the commit.
// It prints one line per image: its reference and digest.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/atoll-edge/atoll/deploy/images"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	out := flag.String("out", "bin/images", "OCI image layout to write the images to")
	push := flag.String("push", "", "registry (host[:port][/path]) to push the images to as <registry>/<name>:<tag>")
	insecure := flag.Bool("insecure", false, "push over plain HTTP (a registry on loopback)")
	tag := flag.String("tag", "dev", "tag of the pushed images")
	version := flag.String("version", "dev", "org.opencontainers.image.version")
	revision := flag.String("revision", "", "org.opencontainers.image.revision (the commit)")
	epoch := flag.String("source-date-epoch", os.Getenv("SOURCE_DATE_EPOCH"), "seconds since the epoch for every timestamp (the commit's time); empty: 0")
	arch := flag.String("arch", "", "GOARCH of the images (default: this machine's)")
	flag.Parse()
	opts := images.Options{Version: *version, Revision: *revision, Arch: *arch}
	if *epoch != "" {
		s, err := strconv.ParseInt(*epoch, 10, 64)
		if err != nil {
			return fmt.Errorf("--source-date-epoch %q: %w", *epoch, err)
		}
		opts.Created = time.Unix(s, 0)
	}
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	p, err := layout.Write(*out, empty.Index)
	if err != nil {
		return err
	}
	for _, img := range images.All {
		built, err := images.Build(ctx, img, opts)
		if err != nil {
			return err
		}
		digest, err := built.Digest()
		if err != nil {
			return err
		}
		ref := images.Repository + "/" + img.Name + ":" + *tag
		if err := p.AppendImage(built, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref})); err != nil {
			return err
		}
		if *push != "" {
			var nopts []name.Option
			if *insecure {
				nopts = append(nopts, name.Insecure)
			}
			ref = *push + "/" + img.Name + ":" + *tag
			t, err := name.NewTag(ref, nopts...)
			if err != nil {
				return err
			}
			if err := remote.Write(t, built, remote.WithContext(ctx)); err != nil {
				return fmt.Errorf("push %s: %w", ref, err)
			}
		}
		size, err := imageSize(built)
		if err != nil {
			return err
		}
		fmt.Printf("%s@%s\t%.1f MiB\n", ref, digest, float64(size)/(1<<20))
	}
	return nil
}

// imageSize is the size of the image's compressed layers.
func imageSize(img v1.Image) (int64, error) {
	layers, err := img.Layers()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, l := range layers {
		s, err := l.Size()
		if err != nil {
			return 0, err
		}
		n += s
	}
	if n == 0 {
		return 0, errors.New("an image without layers")
	}
	return n, nil
}
