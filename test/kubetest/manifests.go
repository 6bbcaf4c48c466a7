package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/test/poll"
)

// applyFieldManager owns what Apply writes.
const applyFieldManager = "kubetest"

// crdGroup is the group of CustomResourceDefinitions.
const crdGroup = "apiextensions.k8s.io"

// DecodeManifests splits a multi-document YAML manifest into objects,
// skipping empty documents (comments only). Each object names its source
// (name, e.g. the file) in errors.
func DecodeManifests(name string, data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", name, i, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d: apiVersion, kind and metadata.name are required", name, i)
		}
		out = append(out, u)
	}
}

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// DryRun asks the apiserver to validate and admit every object but
	// CustomResourceDefinitions and Namespaces without storing it
	// (server-side dry-run: defaulting, schema validation, admission).
	// Those two are applied for real, first, since the objects that use
	// them cannot be validated without them.
	DryRun bool
}

// Apply server-side-applies objs as the admin: CustomResourceDefinitions
// first (and waits until they are established), then Namespaces, then the
// rest in order. It returns every object's error, each naming its object.
func (c *Cluster) Apply(ctx context.Context, objs []*unstructured.Unstructured, opts ApplyOptions) error {
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.client.Discovery()))
	rank := func(u *unstructured.Unstructured) int {
		switch u.GroupVersionKind().GroupKind() {
		case schema.GroupKind{Group: crdGroup, Kind: "CustomResourceDefinition"}:
			return 0
		case schema.GroupKind{Kind: "Namespace"}:
			return 1
		}
		return 2
	}
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b *unstructured.Unstructured) int { return rank(a) - rank(b) })

	var errs []error
	crds := false
	for _, u := range ordered {
		r := rank(u)
		if r > 0 && crds {
			// The CRDs' kinds are served now: discover them again.
			mapper.Reset()
			crds = false
		}
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, u.GetName(), err))
			continue
		}
		ri := dyn.Resource(m.Resource)
		var res dynamic.ResourceInterface = ri
		if m.Scope.Name() == "namespace" {
			if u.GetNamespace() == "" {
				errs = append(errs, fmt.Errorf("%s %s: namespaced, but no metadata.namespace", gvk.Kind, u.GetName()))
				continue
			}
			res = ri.Namespace(u.GetNamespace())
		}
		ao := metav1.ApplyOptions{FieldManager: applyFieldManager, Force: true}
		if opts.DryRun && r == 2 {
			ao.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := res.Apply(ctx, u.GetName(), u, ao); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", gvk.Kind, u.GetNamespace(), u.GetName(), err))
			continue
		}
		if r == 0 {
			crds = true
			if err := c.waitEstablished(ctx, dyn, u.GetName()); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// waitEstablished waits until the CustomResourceDefinition name is served.
func (c *Cluster) waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	crds := dyn.Resource(schema.GroupVersionResource{Group: crdGroup, Version: "v1", Resource: "customresourcedefinitions"})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := poll.Until(ctx, func(ctx context.Context) error {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("not established")
	})
	if err != nil {
		return fmt.Errorf("customresourcedefinition %s: %w", name, err)
	}
	return nil
}
