package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServiceGridSpec is one Service whose traffic stays in the client's unit.
type ServiceGridSpec struct {
	GridPlacement `json:",inline"`
	// Template is the Service's spec.
	Template corev1.ServiceSpec `json:"template"`
}

// ServiceGridStatus is the observed state of a ServiceGrid.
type ServiceGridStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Service is the name of the Service, `<grid>-svc`.
	// +optional
	Service string `json:"service,omitempty"`
	// Conditions: Ready, InvalidSpec.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServiceGrid makes one Service `<grid>-svc` carrying the annotation
// topology.atoll.io/keys=<gridUniqKey>: the edge's endpoints proxy gives a
// client only the endpoints of its own unit.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=sg,categories=grids
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.gridUniqKey`
// +kubebuilder:printcolumn:name="Service",type=string,JSONPath=`.status.service`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 59",message="the name must be at most 59 characters (the Service `<grid>-svc` must fit 63)"
type ServiceGrid struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ServiceGridSpec   `json:"spec"`
	Status ServiceGridStatus `json:"status,omitempty"`
}

// ServiceGridList is a list of ServiceGrids.
// +kubebuilder:object:root=true
type ServiceGridList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServiceGrid `json:"items"`
}
