// Package v1alpha1 is the apps.atoll.io/v1alpha1 API: grid workloads (one
// copy of a workload per unit of nodes) and NodeUnits.
//
//   - DeploymentGrid and StatefulSetGrid stamp one Deployment or
//     StatefulSet `<grid>-<unit>` per value of the node label gridUniqKey,
//     pinned to the unit's nodes, with per-unit templates (SuperEdge's
//     templatePool/templates/defaultTemplateName) and overrides, rolled out
//     unit by unit.
//   - ServiceGrid makes one Service `<grid>-svc` whose traffic stays inside
//     the unit of the client (annotation topology.atoll.io/keys).
//   - NodeUnit (cluster-scoped) describes one unit: its members and their
//     health, kept by cloud/units.
//
// The CustomResourceDefinitions in deploy/crds are generated from these
// types by controller-gen (`go tool task crd:gen`); `crd:check` fails when
// they or zz_generated.deepcopy.go are stale. SuperEdge manifests
// (superedge.io/v1) work with only their apiVersion changed.
//
// +kubebuilder:object:generate=true
// +groupName=apps.atoll.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and Version of the API.
const (
	Group   = "apps.atoll.io"
	Version = "v1alpha1"
)

// GroupVersion is apps.atoll.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: Group, Version: Version}

var (
	schemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the API's types to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&DeploymentGrid{}, &DeploymentGridList{},
		&StatefulSetGrid{}, &StatefulSetGridList{},
		&ServiceGrid{}, &ServiceGridList{},
		&NodeUnit{}, &NodeUnitList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
