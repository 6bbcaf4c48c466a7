// Package deploy holds Atoll's Kubernetes manifests (the YAML files of
// this directory, and the CustomResourceDefinitions that controller-gen
// generates into crds/), embedded so that the tests and the local installations
// apply exactly what operators apply. Its tests apply every manifest to a
// real apiserver (server-side dry-run) and scan them for literal secrets.
package deploy

import (
	"embed"
	"io/fs"
)

//go:embed *.yaml crds/*.yaml examples/*.yaml
var manifests embed.FS

// Manifests is the manifests' file system: one YAML file per shape or
// component, e.g. "atoll-cloud.yaml".
func Manifests() fs.FS { return manifests }

// Read returns one manifest file's content.
func Read(name string) ([]byte, error) { return manifests.ReadFile(name) }

// Names lists the manifest files, sorted: the CustomResourceDefinitions
// (crds/...) first.
func Names() ([]string, error) {
	crds, err := CRDNames()
	if err != nil {
		return nil, err
	}
	top, err := fs.Glob(manifests, "*.yaml")
	if err != nil {
		return nil, err
	}
	return append(crds, top...), nil
}

// ExampleNames lists the example grids (examples/...), sorted: objects
// to apply after crds/, not part of an installation.
func ExampleNames() ([]string, error) { return fs.Glob(manifests, "examples/*.yaml") }

// CRDNames lists the generated CustomResourceDefinitions of the
// apps.atoll.io API (schemas/apps/v1alpha1), e.g.
// "crds/apps.atoll.io_deploymentgrids.yaml", sorted.
func CRDNames() ([]string, error) { return fs.Glob(manifests, "crds/*.yaml") }
