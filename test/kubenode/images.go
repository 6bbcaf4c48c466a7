package kubenode

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// builtinTag tags the images a fleet builds itself.
const builtinTag = "kubenode"

// builtins are the images every fleet's registry holds, built from the Go
// programs of ./images: the sandbox (pause) and a workload (hello: HTTP
// on :8080).
var builtins = []string{"pause", "hello"}

// imageRegistry is an OCI registry (go-containerregistry's, in memory)
// served over plain HTTP on the fleet's bridge, which the nodes'
// containerd pulls from.
type imageRegistry struct {
	addr string
	srv  *http.Server
}

func serveRegistry(host string) (*imageRegistry, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("kubenode: registry: %w", err)
	}
	r := &imageRegistry{addr: l.Addr().String(), srv: &http.Server{
		Handler: registry.New(registry.Logger(log.New(io.Discard, "", 0))), ReadHeaderTimeout: 10 * time.Second}}
	go func() { _ = r.srv.Serve(l) }()
	return r, nil
}

func (r *imageRegistry) close() { _ = r.srv.Close() }

// pushBuiltins builds the builtin images and pushes them.
func (r *imageRegistry) pushBuiltins(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "kubenode-images")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, b := range builtins {
		bin := filepath.Join(dir, b)
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin,
			"github.com/atoll-edge/atoll/test/kubenode/images/"+b)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubenode: build image %s: %w\n%s", b, err, out)
		}
		if err := r.push(ctx, b+":"+builtinTag, bin); err != nil {
			return err
		}
	}
	return nil
}

// push makes an image of one static executable (its entrypoint, at /)
// and pushes it as ref (name:tag) to the registry.
func (r *imageRegistry) push(ctx context.Context, ref, executable string) error {
	data, err := os.ReadFile(executable)
	if err != nil {
		return err
	}
	base := filepath.Base(executable)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: base, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Entrypoint: []string{"/" + base}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return r.write(ctx, ref, img)
}

func (r *imageRegistry) write(ctx context.Context, ref string, img v1.Image) error {
	tag, err := name.NewTag(r.addr+"/"+ref, name.Insecure)
	if err != nil {
		return err
	}
	if err := remote.Write(tag, img, remote.WithContext(ctx)); err != nil {
		return fmt.Errorf("kubenode: push %s: %w", tag, err)
	}
	return nil
}

// PushOCI pushes img to the fleet's registry as ref (name:tag); pods
// run it as Registry()/ref.
func (f *Fleet) PushOCI(ctx context.Context, ref string, img v1.Image) error {
	if f.images == nil {
		return errors.New("kubenode: no registry")
	}
	return f.images.write(ctx, ref, img)
}

// PushExecutable makes an image of one static executable (its entrypoint,
// at /) and pushes it to the fleet's registry as ref (name:tag).
func (f *Fleet) PushExecutable(ctx context.Context, ref, executable string) error {
	if f.images == nil {
		return errors.New("kubenode: no registry")
	}
	return f.images.push(ctx, ref, executable)
}
