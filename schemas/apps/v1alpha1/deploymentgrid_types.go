package v1alpha1

import (
	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// DeploymentGridSpec is one Deployment per unit.
// +kubebuilder:validation:XValidation:rule="!has(self.templates) || self.templates.all(u, self.templates[u] == 'default' || (has(self.templatePool) && self.templates[u] in self.templatePool))",message="every templates value must be 'default' or a key of templatePool"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultTemplateName) || self.defaultTemplateName == 'default' || (has(self.templatePool) && self.defaultTemplateName in self.templatePool)",message="defaultTemplateName must be 'default' or a key of templatePool"
type DeploymentGridSpec struct {
	GridPlacement `json:",inline"`
	// Template is the Deployment spec of every unit that no templates
	// entry (nor defaultTemplateName) sends to templatePool.
	Template appsv1.DeploymentSpec `json:"template"`
	// TemplatePool holds named alternative templates (SuperEdge).
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	TemplatePool map[string]appsv1.DeploymentSpec `json:"templatePool,omitempty"`
	// Templates maps a unit to the name of its templatePool entry, or to
	// "default" (SuperEdge).
	// +kubebuilder:validation:MaxProperties=5000
	// +kubebuilder:validation:additionalProperties:MaxLength=253
	// +optional
	Templates map[string]string `json:"templates,omitempty"`
	// DefaultTemplateName is the template of units templates does not
	// name: "default" (template) or a templatePool key (SuperEdge).
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DefaultTemplateName string `json:"defaultTemplateName,omitempty"`
	// AutoDeleteUnusedTemplate is accepted for SuperEdge manifests; Atoll
	// never edits the pool.
	// +optional
	AutoDeleteUnusedTemplate bool `json:"autoDeleteUnusedTemplate,omitempty"`
	// Overrides change the children of some units, in order.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Overrides []Override `json:"overrides,omitempty"`
	// Rollout says how template changes move through the units.
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
}

// DeploymentGrid runs one Deployment `<grid>-<unit>` in each unit of nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=dg,categories=grids
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.gridUniqKey`
// +kubebuilder:printcolumn:name="Units",type=integer,JSONPath=`.status.unitCount`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyUnits`
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63",message="the name must be at most 63 characters (it is a label value of every child)"
type DeploymentGrid struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DeploymentGridSpec `json:"spec"`
	Status GridStatus         `json:"status,omitempty"`
}

// DeploymentGridList is a list of DeploymentGrids.
// +kubebuilder:object:root=true
type DeploymentGridList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []DeploymentGrid `json:"items"`
}

// StatefulSetGridSpec is one StatefulSet per unit.
// +kubebuilder:validation:XValidation:rule="!has(self.templates) || self.templates.all(u, self.templates[u] == 'default' || (has(self.templatePool) && self.templates[u] in self.templatePool))",message="every templates value must be 'default' or a key of templatePool"
// +kubebuilder:validation:XValidation:rule="!has(self.defaultTemplateName) || self.defaultTemplateName == 'default' || (has(self.templatePool) && self.defaultTemplateName in self.templatePool)",message="defaultTemplateName must be 'default' or a key of templatePool"
type StatefulSetGridSpec struct {
	GridPlacement `json:",inline"`
	// Template is the StatefulSet spec of every unit that no templates
	// entry sends to templatePool. Its serviceName is usually the
	// ServiceGrid's Service, `<servicegrid>-svc`.
	Template appsv1.StatefulSetSpec `json:"template"`
	// +kubebuilder:validation:MaxProperties=32
	// +optional
	TemplatePool map[string]appsv1.StatefulSetSpec `json:"templatePool,omitempty"`
	// +kubebuilder:validation:MaxProperties=5000
	// +kubebuilder:validation:additionalProperties:MaxLength=253
	// +optional
	Templates map[string]string `json:"templates,omitempty"`
	// +kubebuilder:validation:MaxLength=253
	// +optional
	DefaultTemplateName string `json:"defaultTemplateName,omitempty"`
	// +optional
	AutoDeleteUnusedTemplate bool `json:"autoDeleteUnusedTemplate,omitempty"`
	// +kubebuilder:validation:MaxItems=64
	// +optional
	Overrides []Override `json:"overrides,omitempty"`
	// +optional
	Rollout *Rollout `json:"rollout,omitempty"`
}

// StatefulSetGrid runs one StatefulSet `<grid>-<unit>` in each unit of
// nodes.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ssg,categories=grids
// +kubebuilder:printcolumn:name="Key",type=string,JSONPath=`.spec.gridUniqKey`
// +kubebuilder:printcolumn:name="Units",type=integer,JSONPath=`.status.unitCount`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyUnits`
// +kubebuilder:printcolumn:name="Progressing",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 50",message="the name must be at most 50 characters (a StatefulSet `<grid>-<unit>` must fit 52)"
type StatefulSetGrid struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   StatefulSetGridSpec `json:"spec"`
	Status GridStatus          `json:"status,omitempty"`
}

// StatefulSetGridList is a list of StatefulSetGrids.
// +kubebuilder:object:root=true
type StatefulSetGridList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []StatefulSetGrid `json:"items"`
}
