// Package deploy holds Atoll's Kubernetes manifests: a kustomize base
// (base/), one overlay per installation shape (overlays/), the
// CustomResourceDefinitions that controller-gen generates into crds/ and
// example grids (examples/), embedded so that the tests and the local
// installations apply exactly what operators apply. Its tests render every
// overlay with `kubectl kustomize`, apply the result to a real apiserver
// (server-side dry-run) and scan it for literal secrets.
package deploy

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

//go:embed base/*.yaml overlays/*/*.yaml components/*/*.yaml crds/*.yaml examples/*.yaml host/*
var manifests embed.FS

// Files of the base that the local installations apply on their own.
const (
	// CloudManifest is what every atoll-cloud installation holds:
	// namespace, ServiceAccount, RBAC, the webhook configuration and the
	// Secret of its generated certificates, the webhook Service.
	CloudManifest = "base/atoll-cloud.yaml"
	// GridsManifest is the grid controllers' RBAC.
	GridsManifest = "base/grids.yaml"
)

// Manifests is the manifests' file system, laid out as deploy/ is, e.g.
// "base/atoll-cloud.yaml" or "overlays/ha/kustomization.yaml".
func Manifests() fs.FS { return manifests }

// Read returns one manifest file's content, e.g. Read(CloudManifest).
func Read(name string) ([]byte, error) { return manifests.ReadFile(name) }

// Overlays lists the installation shapes, sorted: the directories of
// overlays/ that hold a kustomization.yaml ("embedded-hub",
// "external-nats", "ha"). Each is one `kubectl apply --server-side -k
// deploy/overlays/<name>` for a full installation.
func Overlays() ([]string, error) {
	files, err := fs.Glob(manifests, "overlays/*/kustomization.yaml")
	if err != nil {
		return nil, err
	}
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = path.Base(path.Dir(f))
	}
	return out, nil
}

// Components lists the optional kustomize components, sorted: the
// directories of components/ ("hub-nodeport", "tunnel-mtls"), each to add to an overlay
// of the operator's own.
func Components() ([]string, error) {
	files, err := fs.Glob(manifests, "components/*/kustomization.yaml")
	if err != nil {
		return nil, err
	}
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = path.Base(path.Dir(f))
	}
	return out, nil
}

// Render returns the objects of an overlay, with the given components, as
// `kubectl kustomize` builds them (multi-document YAML), from the embedded
// files: it writes them to a temporary directory and runs kubectl (its
// path) there, so that a file an overlay needs but the package does not
// embed fails here. With components, it builds a kustomization of
// resources [overlays/<overlay>] and those components, as an operator's
// own overlay would.
func Render(ctx context.Context, kubectl, overlay string, components ...string) ([]byte, error) {
	if _, err := fs.Stat(manifests, path.Join("overlays", overlay, "kustomization.yaml")); err != nil {
		return nil, fmt.Errorf("overlay %q: no overlays/%s/kustomization.yaml", overlay, overlay)
	}
	for _, c := range components {
		if _, err := fs.Stat(manifests, path.Join("components", c, "kustomization.yaml")); err != nil {
			return nil, fmt.Errorf("component %q: no components/%s/kustomization.yaml", c, c)
		}
	}
	dir, err := os.MkdirTemp("", "atoll-deploy-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.CopyFS(dir, manifests); err != nil {
		return nil, fmt.Errorf("overlay %s: copy manifests: %w", overlay, err)
	}
	build := filepath.Join(dir, "overlays", overlay)
	if len(components) > 0 {
		var k strings.Builder
		fmt.Fprintf(&k, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../overlays/%s]\ncomponents:\n", overlay)
		for _, c := range components {
			fmt.Fprintf(&k, "  - ../components/%s\n", c)
		}
		build = filepath.Join(dir, "custom")
		if err := os.Mkdir(build, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(build, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
			return nil, err
		}
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, kubectl, "kustomize", build)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("overlay %s %v: kubectl kustomize: %w: %s", overlay, components, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// ExampleNames lists the example grids (examples/...), sorted: objects
// to apply after crds/, not part of an installation.
func ExampleNames() ([]string, error) { return fs.Glob(manifests, "examples/*.yaml") }

// CRDNames lists the generated CustomResourceDefinitions of the
// apps.atoll.io API (schemas/apps/v1alpha1), e.g.
// "crds/apps.atoll.io_deploymentgrids.yaml", sorted (crds/kustomization.yaml
// is not one).
func CRDNames() ([]string, error) { return fs.Glob(manifests, "crds/apps.atoll.io_*.yaml") }

// HostUnit is a systemd unit of host/ (a program run as a host service,
// outside Kubernetes), as far as Atoll's tests read it.
type HostUnit struct {
	// Exec is ExecStart's command line, split into words (the units quote
	// nothing).
	Exec []string
	// EnvironmentFile is where the service reads its environment from.
	EnvironmentFile string
}

// ReadHostUnit reads host/<name> (e.g. "atoll-edge.service").
func ReadHostUnit(name string) (HostUnit, error) {
	b, err := manifests.ReadFile(path.Join("host", name))
	if err != nil {
		return HostUnit{}, err
	}
	var u HostUnit
	joined := strings.ReplaceAll(string(b), "\\\n", " ")
	for line := range strings.SplitSeq(joined, "\n") {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		switch {
		case !ok || strings.HasPrefix(line, "#"):
		case key == "ExecStart":
			u.Exec = strings.Fields(value)
		case key == "EnvironmentFile":
			u.EnvironmentFile = strings.TrimSpace(value)
		}
	}
	if len(u.Exec) == 0 {
		return HostUnit{}, fmt.Errorf("host/%s: no ExecStart", name)
	}
	return u, nil
}

// ReadHostEnv reads an environment file of host/ (e.g. "atoll-edge.env"):
// its NAME=value lines, comments and blank lines left out.
func ReadHostEnv(name string) ([]string, error) {
	b, err := manifests.ReadFile(path.Join("host", name))
	if err != nil {
		return nil, err
	}
	env, err := ParseEnv(b)
	if err != nil {
		return nil, fmt.Errorf("host/%s: %w", name, err)
	}
	return env, nil
}

// ParseEnv reads an environment file as systemd's EnvironmentFile does
// for the units of host/ (no quoting): its NAME=value lines, comments
// and blank lines left out.
func ParseEnv(b []byte) ([]string, error) {
	var env []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			if !strings.Contains(line, "=") {
				return nil, fmt.Errorf("%q is not NAME=value", line)
			}
			env = append(env, line)
		}
	}
	return env, nil
}
