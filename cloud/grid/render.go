package grid

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	jsonpatch "github.com/evanphx/json-patch/v5"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// Kinds of children.
const (
	kindDeployment  = "Deployment"
	kindStatefulSet = "StatefulSet"
)

// ErrInvalid marks an error in a grid's spec that the schema could not
// catch: the grid gets InvalidSpec=True and an Event, and is not retried
// until it changes.
var ErrInvalid = errors.New("invalid grid spec")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// spec is the part of a DeploymentGrid's or StatefulSetGrid's spec that
// rendering reads; S is the child's spec type.
type spec[S any] struct {
	Key                 string
	Template            S
	Pool                map[string]S
	Templates           map[string]string
	DefaultTemplateName string
	Overrides           []appsv1alpha1.Override
}

// kindOf knows one child kind: how to copy its spec, reach the pod
// template, replicas and selector in it, and wrap it in an object.
type kindOf[S any] struct {
	Kind string
	Copy func(S) S
	// Parts returns pointers into s.
	Parts func(s *S) (pod *corev1.PodTemplateSpec, replicas **int32, selector **metav1.LabelSelector)
	// Object wraps a spec in a child object.
	Object func(meta metav1.ObjectMeta, s S) runtime.Object
}

// unitLabels is the label set an override's unitSelector matches: the
// NodeUnit's labels, if any, and apps.atoll.io/unit=<unit>.
func unitLabels(unit string, nodeUnit map[string]string) labels.Set {
	out := labels.Set{}
	maps.Copy(out, nodeUnit)
	out[wellknown.LabelGridUnit] = unit
	return out
}

// chooseTemplate picks unit's template: its templates entry, else
// defaultTemplateName, else the grid's template ("default" names it too).
func chooseTemplate[S any](k kindOf[S], s spec[S], unit string) (S, error) {
	name := s.DefaultTemplateName
	if t, ok := s.Templates[unit]; ok {
		name = t
	}
	if name == "" || name == appsv1alpha1.DefaultTemplateName {
		return k.Copy(s.Template), nil
	}
	t, ok := s.Pool[name]
	if !ok {
		var zero S
		return zero, invalid("unit %s: template %q is not in templatePool", unit, name)
	}
	return k.Copy(t), nil
}

// mergeNodeSelector pins a pod template to the unit: nodeSelector[key] =
// unit, the template's other entries kept (the grid's key wins over a
// template entry of the same key).
func mergeNodeSelector(sel map[string]string, key, unit string) map[string]string {
	out := make(map[string]string, len(sel)+1)
	maps.Copy(out, sel)
	out[key] = unit
	return out
}

// matches reports whether override o applies to unit.
func matches(o appsv1alpha1.Override, i int, unit string, set labels.Set) (bool, error) {
	if slices.Contains(o.Units, unit) {
		return true, nil
	}
	if o.UnitSelector == nil {
		return false, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(o.UnitSelector)
	if err != nil {
		return false, invalid("overrides[%d].unitSelector: %v", i, err)
	}
	return sel.Matches(set), nil
}

// applyOverride changes a pod template and replica count by o's typed
// fields (its patches apply later, on the whole object).
func applyOverride(o appsv1alpha1.Override, i int, pod *corev1.PodTemplateSpec, replicas **int32) error {
	if o.Replicas != nil {
		r := *o.Replicas
		*replicas = &r
	}
	containers := func(name string) []*corev1.Container {
		var out []*corev1.Container
		for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for j := range list {
				if list[j].Name == name {
					out = append(out, &list[j])
				}
			}
		}
		return out
	}
	for _, name := range slices.Sorted(maps.Keys(o.Images)) {
		cs := containers(name)
		if len(cs) == 0 {
			return invalid("overrides[%d].images: no container %q", i, name)
		}
		for _, c := range cs {
			c.Image = o.Images[name]
		}
	}
	for _, name := range slices.Sorted(maps.Keys(o.Resources)) {
		cs := containers(name)
		if len(cs) == 0 {
			return invalid("overrides[%d].resources: no container %q", i, name)
		}
		r := o.Resources[name]
		for _, c := range cs {
			c.Resources = *r.DeepCopy()
		}
	}
	for j := range pod.Spec.Containers {
		c := &pod.Spec.Containers[j]
		for _, e := range o.Env {
			if k := slices.IndexFunc(c.Env, func(x corev1.EnvVar) bool { return x.Name == e.Name }); k >= 0 {
				c.Env[k] = *e.DeepCopy()
			} else {
				c.Env = append(c.Env, *e.DeepCopy())
			}
		}
	}
	return nil
}

// child is one rendered child: the object to apply and its revision.
type child struct {
	Unit     string
	Name     string
	Object   *unstructured.Unstructured
	Revision string
}

// render builds grid's child for unit: the unit's template, the node
// selector and grid labels, the overrides that match the unit in order
// (typed fields, then patches), and the identity (name, namespace, owner,
// labels, node selector) restored after the patches. Errors wrapping
// ErrInvalid are the spec's fault.
func render[S any](k kindOf[S], grid metav1.Object, owner metav1.OwnerReference, s spec[S], unit string, nodeUnitLabels map[string]string) (child, error) {
	name := ChildName(grid.GetName(), unit)
	if err := checkChildName(k.Kind, name); err != nil {
		return child{}, invalid("unit %s: %v", unit, err)
	}
	cs, err := chooseTemplate(k, s, unit)
	if err != nil {
		return child{}, err
	}
	pod, replicas, selector := k.Parts(&cs)
	ids := map[string]string{wellknown.LabelGrid: grid.GetName(), wellknown.LabelGridUnit: unit}
	set := unitLabels(unit, nodeUnitLabels)
	var patches []appsv1alpha1.JSONPatchOperation
	for i, o := range s.Overrides {
		ok, err := matches(o, i, unit, set)
		if err != nil {
			return child{}, err
		}
		if !ok {
			continue
		}
		if err := applyOverride(o, i, pod, replicas); err != nil {
			return child{}, err
		}
		patches = append(patches, o.Patches...)
	}
	pin := func(pod *corev1.PodTemplateSpec, selector **metav1.LabelSelector) {
		pod.Spec.NodeSelector = mergeNodeSelector(pod.Spec.NodeSelector, s.Key, unit)
		pod.Labels = withLabels(pod.Labels, ids)
		if *selector == nil {
			*selector = &metav1.LabelSelector{}
		}
		(*selector).MatchLabels = withLabels((*selector).MatchLabels, ids)
	}
	pin(pod, selector)
	meta := metav1.ObjectMeta{
		Name: name, Namespace: grid.GetNamespace(),
		Labels:          ids,
		OwnerReferences: []metav1.OwnerReference{owner},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(k.Object(meta, cs))
	if err != nil {
		return child{}, fmt.Errorf("unit %s: %w", unit, err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if len(patches) > 0 {
		if u, err = patch(u, patches); err != nil {
			return child{}, fmt.Errorf("unit %s: %w", unit, err)
		}
		// The patches may not move the child out of its grid or unit.
		var typed S
		specMap, _, _ := unstructured.NestedMap(u.Object, "spec")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(specMap, &typed); err != nil {
			return child{}, invalid("unit %s: patched spec: %v", unit, err)
		}
		pod, _, selector := k.Parts(&typed)
		pin(pod, selector)
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(k.Object(meta, typed))
		if err != nil {
			return child{}, fmt.Errorf("unit %s: %w", unit, err)
		}
		u = &unstructured.Unstructured{Object: obj}
	}
	clean(u)
	rev, err := revision(u.Object)
	if err != nil {
		return child{}, err
	}
	u.SetAnnotations(map[string]string{wellknown.AnnotationGridRevision: rev})
	return child{Unit: unit, Name: name, Object: u, Revision: rev}, nil
}

// patch applies RFC 6902 operations to u.
func patch(u *unstructured.Unstructured, ops []appsv1alpha1.JSONPatchOperation) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	p, err := jsonpatch.DecodePatch(raw)
	if err != nil {
		return nil, invalid("patches: %v", err)
	}
	doc, err := u.MarshalJSON()
	if err != nil {
		return nil, err
	}
	out, err := p.Apply(doc)
	if err != nil {
		return nil, invalid("patches: %v", err)
	}
	res := &unstructured.Unstructured{}
	if err := res.UnmarshalJSON(out); err != nil {
		return nil, invalid("patches: result: %v", err)
	}
	return res, nil
}

// withLabels returns base with add set on top.
func withLabels(base, add map[string]string) map[string]string {
	out := make(map[string]string, len(base)+len(add))
	maps.Copy(out, base)
	maps.Copy(out, add)
	return out
}

// clean drops what a typed object marshals but an apply must not own:
// status and empty timestamps.
func clean(u *unstructured.Unstructured) {
	delete(u.Object, "status")
	unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(u.Object, "spec", "template", "metadata", "creationTimestamp")
	if vcts, ok, _ := unstructured.NestedSlice(u.Object, "spec", "volumeClaimTemplates"); ok {
		for _, v := range vcts {
			if m, ok := v.(map[string]any); ok {
				delete(m, "status")
				unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
			}
		}
		_ = unstructured.SetNestedSlice(u.Object, vcts, "spec", "volumeClaimTemplates")
	}
}

// revision hashes a rendered object (encoding/json sorts map keys).
func revision(obj any) (string, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return "", fmt.Errorf("revision: %w", err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:5]), nil
}
