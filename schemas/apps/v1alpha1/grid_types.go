package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DefaultTemplateName is the value of defaultTemplateName (and of a
// templates entry) that names the grid's own template rather than a
// templatePool entry, as in SuperEdge.
const DefaultTemplateName = "default"

// Condition types of the grids.
const (
	// ConditionReady is True when every unit's child has the grid's
	// current template and all its replicas are ready.
	ConditionReady = "Ready"
	// ConditionProgressing is True while a rollout moves from unit to
	// unit or is complete, False when it stopped (a unit missed its
	// progress deadline) until it is resumed.
	ConditionProgressing = "Progressing"
	// ConditionInvalid is True when the spec is invalid in a way the
	// schema cannot say (a patch that does not apply, a child name too
	// long for a unit); the reason and message say which.
	ConditionInvalid = "InvalidSpec"
)

// GridPlacement is what every grid kind shares: the node label that
// groups nodes into units.
type GridPlacement struct {
	// GridUniqKey is the node label key whose values name the units: one
	// child per value. Default: the unit label atoll.io/unit.
	// +kubebuilder:default="atoll.io/unit"
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=316
	// +kubebuilder:validation:Pattern=`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	// +optional
	GridUniqKey string `json:"gridUniqKey,omitempty"`
}

// Override changes the children of some units. Overrides apply in order,
// after the unit's template is chosen; each field that is set applies.
// +kubebuilder:validation:XValidation:rule="has(self.units) != has(self.unitSelector)",message="exactly one of units and unitSelector must be set"
type Override struct {
	// Units names the units this override applies to.
	// +kubebuilder:validation:MaxItems=1000
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	Units []string `json:"units,omitempty"`
	// UnitSelector selects units by their labels: the labels of the
	// NodeUnit of that name, plus apps.atoll.io/unit=<unit>.
	// +optional
	UnitSelector *metav1.LabelSelector `json:"unitSelector,omitempty"`
	// Replicas replaces the child's replica count.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`
	// Images maps container names (of containers or initContainers) to
	// the image they run.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Images map[string]string `json:"images,omitempty"`
	// Env sets environment variables, by name, in every container.
	// +kubebuilder:validation:MaxItems=128
	// +optional
	Env []corev1.EnvVar `json:"env,omitempty"`
	// Resources maps container names to their resource requirements,
	// replaced whole.
	// +kubebuilder:validation:MaxProperties=64
	// +optional
	Resources map[string]corev1.ResourceRequirements `json:"resources,omitempty"`
	// Patches are RFC 6902 JSON patch operations on the child object
	// (paths like /spec/template/spec/containers/0/args), applied last.
	// The child's name, namespace, owner, grid labels and unit node
	// selector are restored after them.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Patches []JSONPatchOperation `json:"patches,omitempty"`
}

// JSONPatchOperation is one RFC 6902 operation.
// +kubebuilder:validation:XValidation:rule="!(self.op in ['move', 'copy']) || has(self.from)",message="move and copy need from"
type JSONPatchOperation struct {
	// +kubebuilder:validation:Enum=add;remove;replace;move;copy;test
	Op string `json:"op"`
	// +kubebuilder:validation:MaxLength=1024
	Path string `json:"path"`
	// +kubebuilder:validation:MaxLength=1024
	// +optional
	From string `json:"from,omitempty"`
	// +optional
	Value *apiextensionsv1.JSON `json:"value,omitempty"`
}

// Rollout says how a template change moves through the units.
type Rollout struct {
	// MaxUnavailableUnits is how many units may be changing at once: a
	// unit is done when its child is Ready with the new template. Unset:
	// all units at once.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxUnavailableUnits *int32 `json:"maxUnavailableUnits,omitempty"`
	// CanaryUnits are changed first, one at a time, in this order.
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=63
	// +listType=set
	// +optional
	CanaryUnits []string `json:"canaryUnits,omitempty"`
	// ProgressDeadlineSeconds is how long a changing unit may take to be
	// Ready before the rollout stops (Progressing=False).
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=1
	// +optional
	ProgressDeadlineSeconds *int32 `json:"progressDeadlineSeconds,omitempty"`
	// Resume continues a stopped rollout: set it to a value it did not
	// hold before (`atoll grid resume` writes the time). The units that
	// missed their deadline count as done.
	// +kubebuilder:validation:MaxLength=64
	// +optional
	Resume string `json:"resume,omitempty"`
}

// GridStatus is the observed state of a DeploymentGrid or StatefulSetGrid.
type GridStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Units is one entry per unit, sorted by name.
	// +listType=map
	// +listMapKey=name
	// +optional
	Units []UnitStatus `json:"units,omitempty"`
	// UnitCount and ReadyUnits count the units and those whose child is
	// Ready with the current template.
	// +optional
	UnitCount int32 `json:"unitCount,omitempty"`
	// +optional
	ReadyUnits int32 `json:"readyUnits,omitempty"`
	// Rollout is where the current rollout is.
	// +optional
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// Conditions: Ready, Progressing, InvalidSpec.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RolloutStatus is the position of a rollout.
type RolloutStatus struct {
	// Revision is the hash of the grid's spec (all but rollout) the
	// rollout brings.
	Revision string `json:"revision"`
	// Updated lists the units whose child has this revision.
	// +optional
	Updated []string `json:"updated,omitempty"`
	// Pending lists the units still on an older revision, in the order
	// they will change.
	// +optional
	Pending []string `json:"pending,omitempty"`
	// Stalled lists the units that missed their progress deadline: the
	// rollout stopped there (Progressing=False) until it is resumed.
	// +optional
	Stalled []string `json:"stalled,omitempty"`
	// Skipped lists the stalled units a resume let the rollout pass: they
	// count as done for this revision.
	// +optional
	Skipped []string `json:"skipped,omitempty"`
	// Resumed is the spec.rollout.resume value last acted on.
	// +optional
	Resumed string `json:"resumed,omitempty"`
}

// UnitStatus is one unit's child.
type UnitStatus struct {
	// Name is the unit (the value of gridUniqKey).
	Name string `json:"name"`
	// Child is the name of the unit's Deployment or StatefulSet.
	Child string `json:"child"`
	// Revision is the hash of the template the child has.
	// +optional
	Revision string `json:"revision,omitempty"`
	// +optional
	Replicas int32 `json:"replicas"`
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`
	// +optional
	AvailableReplicas int32 `json:"availableReplicas"`
	// Ready: the child has observed its spec and every replica is
	// updated and ready.
	// +optional
	Ready bool `json:"ready"`
	// Conditions are the child's conditions (type, status, reason,
	// message).
	// +optional
	Conditions []ChildCondition `json:"conditions,omitempty"`
	// Problem says why the unit's pods are not all ready, as their
	// containers, the scheduler or the kubelet report it: the most common
	// reason, how many pods give it and one message, e.g. `3/3 pods
	// ImagePullBackOff: Back-off pulling image "reg/web:v2"`. Empty while
	// the unit is ready or no pod gives a reason.
	// +optional
	Problem string `json:"problem,omitempty"`
}

// ChildCondition is a condition of a child, without its timestamps.
type ChildCondition struct {
	Type   string                 `json:"type"`
	Status corev1.ConditionStatus `json:"status"`
	// +optional
	Reason string `json:"reason,omitempty"`
	// +optional
	Message string `json:"message,omitempty"`
}
