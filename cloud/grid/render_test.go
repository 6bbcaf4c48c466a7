package grid

import (
	"errors"
	"maps"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

func TestChildNames(t *testing.T) {
	tests := []struct {
		name, kind, grid, unit string
		want                   string // "" = refused
	}{
		{"deployment", kindDeployment, "web", "site-a", "web-site-a"},
		{"statefulset", kindStatefulSet, "db", "site-a", "db-site-a"},
		{"dotted unit in a deployment", kindDeployment, "web", "zone.a", "web-zone.a"},
		{"dotted unit in a statefulset", kindStatefulSet, "db", "zone.a", ""},
		{"uppercase unit", kindDeployment, "web", "Zone-A", ""},
		{"underscore unit", kindDeployment, "web", "zone_a", ""},
		{"statefulset of 52", kindStatefulSet, strings.Repeat("d", 50), "a", strings.Repeat("d", 50) + "-a"},
		{"statefulset of 53", kindStatefulSet, strings.Repeat("d", 50), "ab", ""},
		{"deployment of 253", kindDeployment, strings.Repeat("w", 63), strings.Repeat("u", 189), strings.Repeat("w", 63) + "-" + strings.Repeat("u", 189)},
		{"deployment of 254", kindDeployment, strings.Repeat("w", 63), strings.Repeat("u", 190), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := ChildName(tt.grid, tt.unit)
			err := checkChildName(tt.kind, name)
			switch {
			case tt.want == "" && err == nil:
				t.Fatalf("%q accepted", name)
			case tt.want != "" && err != nil:
				t.Fatalf("%q refused: %v", name, err)
			case tt.want != "" && name != tt.want:
				t.Fatalf("name %q, want %q", name, tt.want)
			}
		})
	}
	if got := ServiceName("web"); got != "web-svc" {
		t.Errorf("ServiceName = %q", got)
	}
}

func TestMergeNodeSelector(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]string
		want map[string]string
	}{
		{"none", nil, map[string]string{"zone": "a"}},
		{"kept", map[string]string{"disk": "ssd"}, map[string]string{"disk": "ssd", "zone": "a"}},
		{"the grid's key wins", map[string]string{"zone": "b", "disk": "ssd"}, map[string]string{"disk": "ssd", "zone": "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := maps.Clone(tt.in)
			got := mergeNodeSelector(in, "zone", "a")
			if !maps.Equal(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			if !maps.Equal(in, tt.in) {
				t.Errorf("the template's selector was changed: %v", in)
			}
		})
	}
}

func testGrid() *appsv1alpha1.DeploymentGrid {
	return &appsv1alpha1.DeploymentGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "uid-1"},
		Spec: appsv1alpha1.DeploymentGridSpec{
			GridPlacement: appsv1alpha1.GridPlacement{GridUniqKey: "zone"},
			Template: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](2),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
					Spec: corev1.PodSpec{
						NodeSelector: map[string]string{"disk": "ssd"},
						Containers: []corev1.Container{
							{Name: "web", Image: "nginx:1", Env: []corev1.EnvVar{{Name: "A", Value: "1"}}},
							{Name: "side", Image: "side:1"},
						},
					},
				},
			},
		},
	}
}

func renderTest(t *testing.T, g *appsv1alpha1.DeploymentGrid, unit string, nodeUnit map[string]string) (*appsv1.Deployment, child, error) {
	t.Helper()
	owner := *metav1.NewControllerRef(g, appsv1alpha1.GroupVersion.WithKind("DeploymentGrid"))
	ch, err := render(deploymentKind, g, owner, deploymentSpec(g, g.Spec.GridUniqKey), unit, nodeUnit)
	if err != nil {
		return nil, ch, err
	}
	var d appsv1.Deployment
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(ch.Object.Object, &d); err != nil {
		t.Fatal(err)
	}
	return &d, ch, nil
}

func TestRender(t *testing.T) {
	d, ch, err := renderTest(t, testGrid(), "a", nil)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "web-a" || d.Namespace != "ns" {
		t.Errorf("name %s/%s", d.Namespace, d.Name)
	}
	ids := map[string]string{wellknown.LabelGrid: "web", wellknown.LabelGridUnit: "a"}
	if !maps.Equal(d.Labels, ids) {
		t.Errorf("labels %v", d.Labels)
	}
	for what, m := range map[string]map[string]string{"pod labels": d.Spec.Template.Labels, "selector": d.Spec.Selector.MatchLabels} {
		want := withLabels(map[string]string{"app": "web"}, ids)
		if !maps.Equal(m, want) {
			t.Errorf("%s %v, want %v", what, m, want)
		}
	}
	if want := map[string]string{"disk": "ssd", "zone": "a"}; !maps.Equal(d.Spec.Template.Spec.NodeSelector, want) {
		t.Errorf("nodeSelector %v", d.Spec.Template.Spec.NodeSelector)
	}
	if ref := metav1.GetControllerOf(d); ref == nil || ref.UID != "uid-1" || ref.Kind != "DeploymentGrid" || !*ref.BlockOwnerDeletion {
		t.Errorf("controller reference %+v", ref)
	}
	if d.Annotations[wellknown.AnnotationGridRevision] != ch.Revision || ch.Revision == "" {
		t.Errorf("revision annotation %v, revision %q", d.Annotations, ch.Revision)
	}
	if _, ok := ch.Object.Object["status"]; ok {
		t.Error("the applied object carries a status")
	}
	// Rendering is deterministic; another unit has another revision.
	_, again, _ := renderTest(t, testGrid(), "a", nil)
	_, other, _ := renderTest(t, testGrid(), "b", nil)
	if again.Revision != ch.Revision || other.Revision == ch.Revision {
		t.Errorf("revisions a %s, a again %s, b %s", ch.Revision, again.Revision, other.Revision)
	}
}

func TestTemplates(t *testing.T) {
	g := testGrid()
	pool := g.Spec.Template.DeepCopy()
	pool.Replicas = ptr.To[int32](5)
	g.Spec.TemplatePool = map[string]appsv1.DeploymentSpec{"big": *pool}
	g.Spec.Templates = map[string]string{"a": "big", "b": "default", "c": "missing"}
	tests := []struct {
		unit, def string
		replicas  int32
		invalid   bool
	}{
		{unit: "a", replicas: 5},
		{unit: "b", replicas: 2},
		{unit: "c", invalid: true},
		{unit: "d", replicas: 2},
		{unit: "d", def: "big", replicas: 5},
		{unit: "b", def: "big", replicas: 2},
		{unit: "d", def: "nope", invalid: true},
	}
	for _, tt := range tests {
		t.Run(tt.unit+"/"+tt.def, func(t *testing.T) {
			g := g.DeepCopy()
			g.Spec.DefaultTemplateName = tt.def
			d, _, err := renderTest(t, g, tt.unit, nil)
			if tt.invalid {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("want ErrInvalid, got %v", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *d.Spec.Replicas != tt.replicas {
				t.Errorf("replicas %d, want %d", *d.Spec.Replicas, tt.replicas)
			}
		})
	}
}

func jsonValue(s string) *apiextensionsv1.JSON { return &apiextensionsv1.JSON{Raw: []byte(s)} }

func TestOverrides(t *testing.T) {
	limits := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m")}}
	tests := []struct {
		name      string
		overrides []appsv1alpha1.Override
		unit      string
		nodeUnit  map[string]string
		check     func(t *testing.T, d *appsv1.Deployment)
		invalid   string
	}{
		{
			name:      "replicas, image, env and resources for the named unit",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Replicas: ptr.To[int32](7), Images: map[string]string{"web": "nginx:2"}, Env: []corev1.EnvVar{{Name: "A", Value: "2"}, {Name: "B", Value: "x"}}, Resources: map[string]corev1.ResourceRequirements{"side": limits}}},
			unit:      "a",
			check: func(t *testing.T, d *appsv1.Deployment) {
				c := d.Spec.Template.Spec.Containers
				if *d.Spec.Replicas != 7 || c[0].Image != "nginx:2" || c[1].Image != "side:1" {
					t.Errorf("replicas %d, images %s %s", *d.Spec.Replicas, c[0].Image, c[1].Image)
				}
				if len(c[0].Env) != 2 || c[0].Env[0].Value != "2" || c[0].Env[1].Name != "B" || len(c[1].Env) != 2 {
					t.Errorf("env %v / %v", c[0].Env, c[1].Env)
				}
				if !c[1].Resources.Limits.Cpu().Equal(resource.MustParse("500m")) || c[0].Resources.Limits != nil {
					t.Errorf("resources %v / %v", c[0].Resources, c[1].Resources)
				}
			},
		},
		{
			name:      "another unit is untouched",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Replicas: ptr.To[int32](7)}},
			unit:      "b",
			check: func(t *testing.T, d *appsv1.Deployment) {
				if *d.Spec.Replicas != 2 {
					t.Errorf("replicas %d", *d.Spec.Replicas)
				}
			},
		},
		{
			name: "in order: the last wins",
			overrides: []appsv1alpha1.Override{
				{Units: []string{"a"}, Replicas: ptr.To[int32](3)},
				{UnitSelector: &metav1.LabelSelector{MatchLabels: map[string]string{wellknown.LabelGridUnit: "a"}}, Replicas: ptr.To[int32](4)},
			},
			unit: "a",
			check: func(t *testing.T, d *appsv1.Deployment) {
				if *d.Spec.Replicas != 4 {
					t.Errorf("replicas %d, want 4", *d.Spec.Replicas)
				}
			},
		},
		{
			name:      "unitSelector on the NodeUnit's labels",
			overrides: []appsv1alpha1.Override{{UnitSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}, Replicas: ptr.To[int32](9)}},
			unit:      "a", nodeUnit: map[string]string{"tier": "gold"},
			check: func(t *testing.T, d *appsv1.Deployment) {
				if *d.Spec.Replicas != 9 {
					t.Errorf("replicas %d, want 9", *d.Spec.Replicas)
				}
			},
		},
		{
			name: "patches, after the typed fields",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Images: map[string]string{"web": "nginx:2"}, Patches: []appsv1alpha1.JSONPatchOperation{
				{Op: "add", Path: "/spec/template/spec/containers/0/args", Value: jsonValue(`["--site","a"]`)},
				{Op: "test", Path: "/spec/template/spec/containers/0/image", Value: jsonValue(`"nginx:2"`)},
				{Op: "remove", Path: "/spec/template/spec/containers/1"},
			}}},
			unit: "a",
			check: func(t *testing.T, d *appsv1.Deployment) {
				c := d.Spec.Template.Spec.Containers
				if len(c) != 1 || len(c[0].Args) != 2 || c[0].Args[1] != "a" {
					t.Errorf("containers %+v", c)
				}
			},
		},
		{
			name: "patches cannot move the child out of its grid or unit",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Patches: []appsv1alpha1.JSONPatchOperation{
				{Op: "replace", Path: "/spec/template/spec/nodeSelector", Value: jsonValue(`{"zone":"b"}`)},
				{Op: "replace", Path: "/metadata/name", Value: jsonValue(`"evil"`)},
				{Op: "remove", Path: "/metadata/ownerReferences"},
				{Op: "replace", Path: "/spec/selector/matchLabels", Value: jsonValue(`{"app":"web"}`)},
			}}},
			unit: "a",
			check: func(t *testing.T, d *appsv1.Deployment) {
				if d.Name != "web-a" || d.Spec.Template.Spec.NodeSelector["zone"] != "a" || metav1.GetControllerOf(d) == nil || d.Spec.Selector.MatchLabels[wellknown.LabelGridUnit] != "a" {
					t.Errorf("name %s, nodeSelector %v, owner %v, selector %v", d.Name, d.Spec.Template.Spec.NodeSelector, d.OwnerReferences, d.Spec.Selector)
				}
			},
		},
		{
			name:      "a patch that does not apply",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Patches: []appsv1alpha1.JSONPatchOperation{{Op: "remove", Path: "/spec/nothing/here"}}}},
			unit:      "a", invalid: "patches",
		},
		{
			name:      "a failing test op",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Patches: []appsv1alpha1.JSONPatchOperation{{Op: "test", Path: "/spec/replicas", Value: jsonValue(`99`)}}}},
			unit:      "a", invalid: "patches",
		},
		{
			name:      "an image for no container",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Images: map[string]string{"nope": "x"}}},
			unit:      "a", invalid: `no container "nope"`,
		},
		{
			name:      "resources for no container",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Resources: map[string]corev1.ResourceRequirements{"nope": limits}}},
			unit:      "a", invalid: `no container "nope"`,
		},
		{
			name:      "a bad unitSelector",
			overrides: []appsv1alpha1.Override{{UnitSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "Sometimes"}}}}},
			unit:      "a", invalid: "unitSelector",
		},
		{
			name: "a patch that breaks the spec's type",
			overrides: []appsv1alpha1.Override{{Units: []string{"a"}, Patches: []appsv1alpha1.JSONPatchOperation{
				{Op: "replace", Path: "/spec/replicas", Value: jsonValue(`"many"`)},
			}}},
			unit: "a", invalid: "patched spec",
		},
		{
			name: "a unit whose name cannot be a child's", unit: "Zone_A", invalid: "unit Zone_A",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := testGrid()
			g.Spec.Overrides = tt.overrides
			d, _, err := renderTest(t, g, tt.unit, tt.nodeUnit)
			if tt.invalid != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.invalid) {
					t.Fatalf("want ErrInvalid with %q, got %v", tt.invalid, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, d)
		})
	}
}

func TestRenderService(t *testing.T) {
	g := &appsv1alpha1.ServiceGrid{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", UID: "u"},
		Spec:       appsv1alpha1.ServiceGridSpec{Template: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}},
	}
	u, rev, err := renderService(g, "zone")
	if err != nil {
		t.Fatal(err)
	}
	if u.GetName() != "web-svc" || u.GetAnnotations()[wellknown.TopologyKeysAnnotation] != "zone" || u.GetAnnotations()[wellknown.AnnotationGridRevision] != rev {
		t.Errorf("service %s, annotations %v", u.GetName(), u.GetAnnotations())
	}
	g.Name = strings.Repeat("s", 60)
	if _, _, err := renderService(g, "zone"); !errors.Is(err, ErrInvalid) {
		t.Errorf("a 64-character Service name: %v", err)
	}
}
