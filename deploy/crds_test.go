package deploy_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// crdObjects decodes the generated CustomResourceDefinitions.
func crdObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	names, err := deploy.CRDNames()
	if err != nil || len(names) != 4 {
		t.Fatalf("want the 4 CRDs of apps.atoll.io in crds/, got %v (%v)", names, err)
	}
	var out []*unstructured.Unstructured
	for _, n := range names {
		data, err := deploy.Read(n)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := kubetest.DecodeManifests(n, data)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, objs...)
	}
	return out
}

const superEdgeGrid = `
apiVersion: apps.atoll.io/v1alpha1
kind: DeploymentGrid
metadata: {name: deploymentgrid-demo, namespace: default}
spec:
  gridUniqKey: zone1
  defaultTemplateName: test1
  templatePool:
    test1:
      replicas: 2
      selector: {matchLabels: {appGrid: echo}}
      template:
        metadata: {labels: {appGrid: echo}}
        spec: {containers: [{name: echo, image: "superedge/echoserver:2.2"}]}
    test2:
      replicas: 3
      selector: {matchLabels: {appGrid: echo}}
      template:
        metadata: {labels: {appGrid: echo}}
        spec: {containers: [{name: echo, image: "superedge/echoserver:2.3"}]}
  templates:
    zone1: test1
    zone2: test2
  autoDeleteUnusedTemplate: true
  template:
    replicas: 2
    selector: {matchLabels: {appGrid: echo}}
    template:
      metadata: {labels: {appGrid: echo}}
      spec: {containers: [{name: echo, image: "superedge/echoserver:2.2"}]}
`

// TestGridCRDsValidate installs the generated CRDs into a real apiserver
// and has it judge grid objects (server-side dry-run): SuperEdge-style and
// Atoll-style grids pass; names too long for their children, templates
// naming no templatePool key, malformed overrides and bad rollout values
// are refused, each for its own reason.
func TestGridCRDsValidate(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := cluster.Apply(ctx, crdObjects(t), kubetest.ApplyOptions{}); err != nil {
		t.Fatalf("CRDs refused: %v", err)
	}
	const dg = "apiVersion: apps.atoll.io/v1alpha1\nkind: DeploymentGrid\nmetadata: {name: %NAME%, namespace: default}\nspec:\n  template: {selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}, spec: {containers: [{name: web, image: nginx}]}}}\n"
	grid := func(name, extra string) string {
		return strings.ReplaceAll(dg, "%NAME%", name) + extra
	}
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name, doc string
		refused   string // substring of the apiserver's refusal; "" = accepted
	}{
		{"superedge manifest", superEdgeGrid, ""},
		{"plain grid", grid("web", ""), ""},
		{"name of 63", grid(long(63), ""), ""},
		{"name of 64", grid(long(64), ""), "at most 63 characters"},
		{"templates naming an unknown pool key", grid("web", "  templatePool: {a: {selector: {matchLabels: {app: web}}, template: {metadata: {labels: {app: web}}}}}\n  templates: {zone1: b}\n"), "key of templatePool"},
		{"templates without a pool", grid("web", "  templates: {zone1: b}\n"), "key of templatePool"},
		{"templates naming default", grid("web", "  templates: {zone1: default}\n"), ""},
		{"unknown defaultTemplateName", grid("web", "  defaultTemplateName: nope\n"), "defaultTemplateName must be"},
		{"override with units", grid("web", "  overrides: [{units: [zone1], replicas: 3, images: {web: nginx:2}, patches: [{op: add, path: /spec/template/spec/hostNetwork, value: true}]}]\n"), ""},
		{"override with units and selector", grid("web", "  overrides: [{units: [zone1], unitSelector: {matchLabels: {a: b}}}]\n"), "exactly one of units and unitSelector"},
		{"override with neither", grid("web", "  overrides: [{replicas: 1}]\n"), "exactly one of units and unitSelector"},
		{"patch op unknown", grid("web", "  overrides: [{units: [a], patches: [{op: merge, path: /spec}]}]\n"), "Unsupported value"},
		{"patch move without from", grid("web", "  overrides: [{units: [a], patches: [{op: move, path: /spec/x}]}]\n"), "need from"},
		{"negative replicas override", grid("web", "  overrides: [{units: [a], replicas: -1}]\n"), "greater than or equal to 0"},
		{"rollout of zero units", grid("web", "  rollout: {maxUnavailableUnits: 0}\n"), "greater than or equal to 1"},
		{"bad grid key", grid("web", "  gridUniqKey: 'not a key'\n"), "should match"},
		{"no template", "apiVersion: apps.atoll.io/v1alpha1\nkind: DeploymentGrid\nmetadata: {name: x, namespace: default}\nspec: {gridUniqKey: zone}\n", "spec.template: Required value"},
		{"statefulset grid name of 50", "apiVersion: apps.atoll.io/v1alpha1\nkind: StatefulSetGrid\nmetadata: {name: " + long(50) + ", namespace: default}\nspec: {template: {serviceName: s-svc, selector: {matchLabels: {app: s}}, template: {metadata: {labels: {app: s}}}}}\n", ""},
		{"statefulset grid name of 51", "apiVersion: apps.atoll.io/v1alpha1\nkind: StatefulSetGrid\nmetadata: {name: " + long(51) + ", namespace: default}\nspec: {template: {serviceName: s-svc, selector: {matchLabels: {app: s}}, template: {metadata: {labels: {app: s}}}}}\n", "at most 50 characters"},
		{"service grid", "apiVersion: apps.atoll.io/v1alpha1\nkind: ServiceGrid\nmetadata: {name: s, namespace: default}\nspec: {gridUniqKey: zone, template: {selector: {app: s}, ports: [{port: 80}]}}\n", ""},
		{"service grid name of 60", "apiVersion: apps.atoll.io/v1alpha1\nkind: ServiceGrid\nmetadata: {name: " + long(60) + ", namespace: default}\nspec: {template: {ports: [{port: 80}]}}\n", "at most 59 characters"},
		{"node unit", "apiVersion: apps.atoll.io/v1alpha1\nkind: NodeUnit\nmetadata: {name: site-a}\nspec: {unitLabel: atoll.io/unit}\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := kubetest.DecodeManifests(tt.name, []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			err = cluster.Apply(ctx, objs, kubetest.ApplyOptions{DryRun: true})
			switch {
			case tt.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.refused != "" && err == nil:
				t.Fatalf("accepted; want a refusal with %q", tt.refused)
			case tt.refused != "" && !strings.Contains(err.Error(), tt.refused):
				t.Fatalf("refused for another reason: %v; want %q", err, tt.refused)
			}
		})
	}
}

// TestExamplesApply: the example grids of examples/ pass the apiserver's
// validation (server-side dry-run) once the CRDs are installed.
func TestExamplesApply(t *testing.T) {
	names, err := deploy.ExampleNames()
	if err != nil || len(names) == 0 {
		t.Fatalf("no examples (%v)", err)
	}
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := cluster.Apply(ctx, crdObjects(t), kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		data, err := deploy.Read(n)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := kubetest.DecodeManifests(n, data)
		if err != nil {
			t.Fatal(err)
		}
		if err := cluster.Apply(ctx, objs, kubetest.ApplyOptions{DryRun: true}); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}

// TestGridCRDDefaults: gridUniqKey defaults to the unit label of
// internal/wellknown (schemas cannot import it; this keeps them equal).
func TestGridCRDDefaults(t *testing.T) {
	for _, o := range crdObjects(t) {
		if o.GetName() == "nodeunits.apps.atoll.io" {
			continue
		}
		versions, _, _ := unstructured.NestedSlice(o.Object, "spec", "versions")
		if len(versions) != 1 {
			t.Fatalf("%s: want one version, got %d", o.GetName(), len(versions))
		}
		def, _, _ := unstructured.NestedString(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "gridUniqKey", "default")
		if def != wellknown.LabelUnit {
			t.Errorf("%s: gridUniqKey defaults to %q, want %q", o.GetName(), def, wellknown.LabelUnit)
		}
	}
}
