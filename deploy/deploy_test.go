package deploy_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// wantOverlays are the installation shapes deploy/overlays must hold, and
// wantComponents the components of deploy/components.
var (
	wantOverlays   = []string{"embedded-hub", "external-nats", "ha"}
	wantComponents = []string{"apiserver-via-hub", "hub-nodeport", "hub-volume", "node-dns", "tunnel-mtls"}
)

// renderAll renders every overlay, alone ("ha") and with each component
// ("ha+tunnel-mtls"), with the kubectl of bin/ (the version of the test
// apiserver), once per test binary.
var renderAll = sync.OnceValues(func() (map[string][]*unstructured.Unstructured, error) {
	names, err := deploy.Overlays()
	if err != nil {
		return nil, err
	}
	if !slices.Equal(names, wantOverlays) {
		return nil, fmt.Errorf("overlays/ holds %v, want %v", names, wantOverlays)
	}
	components, err := deploy.Components()
	if err != nil {
		return nil, err
	}
	if !slices.Equal(components, wantComponents) {
		return nil, fmt.Errorf("components/ holds %v, want %v", components, wantComponents)
	}
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := map[string][]*unstructured.Unstructured{}
	render := func(key, overlay string, components ...string) error {
		data, err := deploy.Render(ctx, kubectl, overlay, components...)
		if err != nil {
			return err
		}
		objs, err := kubetest.DecodeManifests("overlays/"+key, data)
		if err != nil {
			return err
		}
		out[key] = objs
		return nil
	}
	for _, n := range names {
		if err := render(n, n); err != nil {
			return nil, err
		}
		for _, c := range components {
			if err := render(n+"+"+c, n, c); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
})

// objects returns every overlay's objects as `kubectl kustomize` renders
// them, by overlay (and overlay+component).
func objects(t *testing.T) map[string][]*unstructured.Unstructured {
	t.Helper()
	out, err := renderAll()
	if err != nil {
		t.Fatalf("render overlays: %v", err)
	}
	return out
}

// TestOverlaysApply renders every overlay (alone and with each component)
// and applies the result to a real apiserver with server-side dry-run
// (CustomResourceDefinitions and Namespaces for real, first): every object
// must pass the apiserver's decoding, schema validation, defaulting and
// admission. For each overlay it then runs the install command
// deploy/README.md gives, `kubectl apply --server-side -k
// overlays/<name>`, on the files of this directory (server-side dry-run
// too).
func TestOverlaysApply(t *testing.T) {
	overlays := objects(t)
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for _, name := range slices.Sorted(maps.Keys(overlays)) {
		t.Run(name, func(t *testing.T) {
			objs := overlays[name]
			if err := cluster.Apply(ctx, objs, kubetest.ApplyOptions{DryRun: true}); err != nil {
				t.Fatalf("apiserver refused objects of overlays/%s:\n%v", name, err)
			}
			t.Logf("%d objects accepted", len(objs))
			if strings.Contains(name, "+") {
				return // no directory of deploy/ holds it
			}
			cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", cluster.KubeconfigPath(),
				"apply", "--server-side", "--dry-run=server", "-k", filepath.Join("overlays", name))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("kubectl apply --server-side -k overlays/%s: %v\n%s", name, err, out)
			}
		})
	}

	// The check can fail: an object the apiserver must refuse.
	bad, err := kubetest.DecodeManifests("bad", []byte("apiVersion: v1\nkind: Service\nmetadata: {name: x, namespace: atoll-system}\nspec: {ports: [{port: 99999}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Apply(ctx, bad, kubetest.ApplyOptions{DryRun: true}); err == nil {
		t.Error("a Service with port 99999 was accepted")
	}
}

// secretPatterns are literal credentials in a manifest's values.
var secretPatterns = []struct {
	what string
	re   *regexp.Regexp
}{
	{"PEM block (key or certificate)", regexp.MustCompile(`-----BEGIN [A-Z ]+-----`)},
	{"nkey seed", regexp.MustCompile(`\bS[UAONCX][A-Z2-7]{56}\b`)},
	{"JWT", regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ`)},
	{"bcrypt hash", regexp.MustCompile(`\$2[aby]?\$\d\d\$`)},
	{"password in a URL", regexp.MustCompile(`://[^/\s:@]+:[^/\s@]+@`)},
	{"password, token or secret assigned a value", regexp.MustCompile(`(?i)(password|passwd|token|secret)["']?\s*[:=]\s*["']?[^\s"'$]`)},
}

// sensitiveName matches environment variable names that hold credentials.
var sensitiveName = regexp.MustCompile(`(?i)pass|token|secret|seed|credential|private|_key$`)

// literalSecrets lists where obj carries a credential in clear: a Secret
// with data, an environment variable of a credential-like name with a
// literal value, or a value matching secretPatterns.
func literalSecrets(obj *unstructured.Unstructured) []string {
	var found []string
	where := fmt.Sprintf("%s %s/%s", obj.GetKind(), obj.GetNamespace(), obj.GetName())
	if obj.GetKind() == "Secret" {
		for _, f := range []string{"data", "stringData"} {
			if m, _, _ := unstructured.NestedMap(obj.Object, f); len(m) > 0 {
				found = append(found, where+": a Secret with "+f+" (create Secrets at install time, or let atoll-cloud generate them)")
			}
		}
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if name, ok := v["name"].(string); ok && sensitiveName.MatchString(name) {
				if val, ok := v["value"].(string); ok && val != "" {
					found = append(found, fmt.Sprintf("%s: %s: %s has a literal value (use valueFrom.secretKeyRef)", where, path, name))
				}
			}
			for k, e := range v {
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		case string:
			for _, p := range secretPatterns {
				if p.re.MatchString(v) {
					found = append(found, fmt.Sprintf("%s: %s: %s", where, path, p.what))
				}
			}
		}
	}
	walk("", obj.Object)
	return found
}

// TestNoLiteralSecrets scans every object of every overlay, rendered
// (comments are not objects: the examples in them are not applied), for
// credentials in clear.
// Every credential comes from a Secret the operator creates, or that
// atoll-cloud generates at start.
func TestNoLiteralSecrets(t *testing.T) {
	for name, objs := range objects(t) {
		for _, o := range objs {
			for _, f := range literalSecrets(o) {
				t.Errorf("%s: %s", name, f)
			}
		}
	}
}

// TestLiteralSecretsFound shows the scan finds what it must.
func TestLiteralSecretsFound(t *testing.T) {
	tests := []struct {
		name, doc string
	}{
		{"secret with data", "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {a: b}\n"},
		{"env password", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, env: [{name: HUB_PASSWORD, value: hunter2}]}]}\n"},
		{"flag password", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, args: [--hub-password=hunter2]}]}\n"},
		{"url password", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {conf: 'routes: [nats-route://route:pw@h:6222]'}\n"},
		{"nats conf password", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {conf: 'authorization { user: route, password: s3cret }'}\n"},
		{"nkey seed", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY}\n"},
		{"pem key", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {k: \"-----BEGIN EC PRIVATE KEY-----\\nMHc\"}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := kubetest.DecodeManifests(tt.name, []byte(tt.doc))
			if err != nil {
				t.Fatal(err)
			}
			if f := literalSecrets(objs[0]); len(f) == 0 {
				t.Errorf("not found in %q", tt.doc)
			} else {
				t.Log(strings.Join(f, "; "))
			}
		})
	}
	ok, _ := kubetest.DecodeManifests("ok", []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {volumes: [{name: v, secret: {secretName: atoll-cloud}}], containers: [{name: c, args: [--seed-file=/var/lib/atoll/node.nk, --hub-password-file=/etc/x]}]}\n"))
	if f := literalSecrets(ok[0]); len(f) > 0 {
		t.Errorf("false positives: %v", f)
	}
}

// TestOnlyAtollCloudHoldsAToken: of every workload of every overlay, only
// atoll-cloud's pods get a Kubernetes API token (its ServiceAccount's,
// whose RBAC test/e2e proves minimal); the edge agents and the hub
// servers never talk to the apiserver and mount none. The agents' only
// token is for audience "atoll" (the apiserver refuses it), of a
// ServiceAccount no binding grants anything: it proves their node to
// atoll-cloud.
func TestOnlyAtollCloudHoldsAToken(t *testing.T) {
	workloads := 0
	for name, objs := range objects(t) {
		for _, o := range objs {
			switch o.GetKind() {
			case "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob":
			default:
				continue
			}
			workloads++
			spec, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			if !ok {
				t.Fatalf("%s: %s %s has no pod template", name, o.GetKind(), o.GetName())
			}
			sa, _ := spec["serviceAccountName"].(string)
			automount, set := spec["automountServiceAccountToken"].(bool)
			switch {
			case sa == "atoll-cloud":
				continue
			case set && !automount:
			default:
				t.Errorf("%s: %s %s runs as %q with an API token: set automountServiceAccountToken: false", name, o.GetKind(), o.GetName(), cmp.Or(sa, "default"))
			}
			volumes, _, _ := unstructured.NestedSlice(spec, "volumes")
			for _, v := range volumes {
				sources, _, _ := unstructured.NestedSlice(v.(map[string]any), "projected", "sources")
				for _, src := range sources {
					aud, ok, _ := unstructured.NestedString(src.(map[string]any), "serviceAccountToken", "audience")
					if ok && aud != "atoll" {
						t.Errorf("%s: %s %s mounts a token for audience %q, want only \"atoll\"", name, o.GetKind(), o.GetName(), aud)
					} else if _, isToken, _ := unstructured.NestedMap(src.(map[string]any), "serviceAccountToken"); isToken && !ok {
						t.Errorf("%s: %s %s mounts a token for the apiserver's audience", name, o.GetKind(), o.GetName())
					}
					// A node rebooted while cut off starts the pod with the
					// token its local API endpoint kept; the kubelet renews
					// a token daily, so a week's has 6 days left at any cut.
					exp, _, _ := unstructured.NestedFieldNoCopy(src.(map[string]any), "serviceAccountToken", "expirationSeconds")
					if secs, _ := strconv.ParseFloat(fmt.Sprint(exp), 64); ok && secs < 7*24*3600 {
						t.Errorf("%s: %s %s asks its %q token for %v s: a node rebooted offline cannot start it after that, want a week", name, o.GetKind(), o.GetName(), aud, exp)
					}
				}
			}
			for _, b := range objs {
				if b.GetKind() != "RoleBinding" && b.GetKind() != "ClusterRoleBinding" {
					continue
				}
				subjects, _, _ := unstructured.NestedSlice(b.Object, "subjects")
				for _, sub := range subjects {
					if m := sub.(map[string]any); m["kind"] == "ServiceAccount" && m["name"] == sa && sa != "" {
						t.Errorf("%s: %s %s binds %s's ServiceAccount %s to rights", name, b.GetKind(), b.GetName(), o.GetName(), sa)
					}
				}
			}
		}
	}
	if workloads == 0 {
		t.Fatal("no workloads found")
	}
}
