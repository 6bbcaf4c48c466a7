package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeUnitSpec says which nodes form the unit.
type NodeUnitSpec struct {
	// UnitLabel is the node label key, and the unit (the NodeUnit's name)
	// its value.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	UnitLabel string `json:"unitLabel"`
}

// NodeUnitStatus is the unit's members and their health.
type NodeUnitStatus struct {
	// Members are the unit's nodes, sorted.
	// +listType=set
	// +optional
	Members []string `json:"members,omitempty"`
	// ReadyNodes and NotReadyNodes count the members by their Ready
	// condition.
	// +optional
	ReadyNodes int32 `json:"readyNodes"`
	// +optional
	NotReadyNodes int32 `json:"notReadyNodes"`
	// Disruption is the health service's state of the unit.
	// +kubebuilder:validation:Enum="";Normal;PartialDisruption;FullDisruption;AgentsSilent
	// +optional
	Disruption string `json:"disruption,omitempty"`
}

// NodeUnit is one unit (site) of nodes. cloud/units keeps it; its labels
// are what grid overrides' unitSelector matches.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=nu
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyNodes`
// +kubebuilder:printcolumn:name="NotReady",type=integer,JSONPath=`.status.notReadyNodes`
// +kubebuilder:printcolumn:name="Disruption",type=string,JSONPath=`.status.disruption`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the name is a label value: at most 63 characters"
type NodeUnit struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   NodeUnitSpec   `json:"spec"`
	Status NodeUnitStatus `json:"status,omitempty"`
}

// NodeUnitList is a list of NodeUnits.
// +kubebuilder:object:root=true
type NodeUnitList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeUnit `json:"items"`
}
