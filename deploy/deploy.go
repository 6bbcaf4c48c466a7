// Package deploy holds Atoll's Kubernetes manifests (the YAML files of
// this directory), embedded so that the tests and the local installations
// apply exactly what operators apply. Its tests apply every manifest to a
// real apiserver (server-side dry-run) and scan them for literal secrets.
package deploy

import (
	"embed"
	"io/fs"
)

//go:embed *.yaml
var manifests embed.FS

// Manifests is the manifests' file system: one YAML file per shape or
// component, e.g. "atoll-cloud.yaml".
func Manifests() fs.FS { return manifests }

// Read returns one manifest file's content.
func Read(name string) ([]byte, error) { return manifests.ReadFile(name) }

// Names lists the manifest files, sorted.
func Names() ([]string, error) { return fs.Glob(manifests, "*.yaml") }
