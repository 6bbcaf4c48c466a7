package grid

import (
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

var deploymentKind = kindOf[appsv1.DeploymentSpec]{
	Kind: kindDeployment,
	Copy: func(s appsv1.DeploymentSpec) appsv1.DeploymentSpec { return *s.DeepCopy() },
	Parts: func(s *appsv1.DeploymentSpec) (*corev1.PodTemplateSpec, **int32, **metav1.LabelSelector) {
		return &s.Template, &s.Replicas, &s.Selector
	},
	Object: func(meta metav1.ObjectMeta, s appsv1.DeploymentSpec) runtime.Object {
		return &appsv1.Deployment{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: kindDeployment}, ObjectMeta: meta, Spec: s}
	},
}

var statefulSetKind = kindOf[appsv1.StatefulSetSpec]{
	Kind: kindStatefulSet,
	Copy: func(s appsv1.StatefulSetSpec) appsv1.StatefulSetSpec { return *s.DeepCopy() },
	Parts: func(s *appsv1.StatefulSetSpec) (*corev1.PodTemplateSpec, **int32, **metav1.LabelSelector) {
		return &s.Template, &s.Replicas, &s.Selector
	},
	Object: func(meta metav1.ObjectMeta, s appsv1.StatefulSetSpec) runtime.Object {
		return &appsv1.StatefulSet{TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: kindStatefulSet}, ObjectMeta: meta, Spec: s}
	},
}

func deploymentSpec(g *appsv1alpha1.DeploymentGrid, key string) spec[appsv1.DeploymentSpec] {
	return spec[appsv1.DeploymentSpec]{
		Key: key, Template: g.Spec.Template, Pool: g.Spec.TemplatePool, Templates: g.Spec.Templates,
		DefaultTemplateName: g.Spec.DefaultTemplateName, Overrides: g.Spec.Overrides,
	}
}

func statefulSetSpec(g *appsv1alpha1.StatefulSetGrid, key string) spec[appsv1.StatefulSetSpec] {
	return spec[appsv1.StatefulSetSpec]{
		Key: key, Template: g.Spec.Template, Pool: g.Spec.TemplatePool, Templates: g.Spec.Templates,
		DefaultTemplateName: g.Spec.DefaultTemplateName, Overrides: g.Spec.Overrides,
	}
}
