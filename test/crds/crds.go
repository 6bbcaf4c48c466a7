// Package crds installs Atoll's CustomResourceDefinitions (deploy/crds)
// into a test cluster, as an operator's `kubectl apply --server-side -k deploy/crds`
// would.
package crds

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Objects decodes every CRD of deploy/crds.
func Objects() ([]*unstructured.Unstructured, error) {
	names, err := deploy.CRDNames()
	if err != nil {
		return nil, fmt.Errorf("crds: list: %w", err)
	}
	var objs []*unstructured.Unstructured
	for _, n := range names {
		data, err := deploy.Read(n)
		if err != nil {
			return nil, fmt.Errorf("crds: read %s: %w", n, err)
		}
		o, err := kubetest.DecodeManifests(n, data)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

// Install applies every CRD of deploy/crds to cluster and returns once
// the apiserver serves them (kubetest's Apply waits for CRDs to be
// established).
func Install(ctx context.Context, cluster *kubetest.Cluster) error {
	objs, err := Objects()
	if err != nil {
		return err
	}
	if err := cluster.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		return fmt.Errorf("crds: apply: %w", err)
	}
	return nil
}
