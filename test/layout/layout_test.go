package layout

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/atoll-edge/atoll/"

// deps lists every package of the module with its transitive non-test
// dependencies, from the go command itself.
func deps(t *testing.T) map[string][]string {
	t.Helper()
	return list(t, `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`)
}

// imports lists every package of the module with its direct imports:
// of its own files (test false), or of its test files (test true).
func imports(t *testing.T, test bool) map[string][]string {
	t.Helper()
	if test {
		return list(t, `{{.ImportPath}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`)
	}
	return list(t, `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`)
}

// list runs go list -f format over the module, one package a line: its
// import path (module-relative), then the paths format lists.
func list(t *testing.T, format string) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", format, module+"...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	all := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		all[strings.TrimPrefix(f[0], module)] = f[1:]
	}
	if len(all) < 20 {
		t.Fatalf("go list found only %d packages", len(all))
	}
	return all
}

func under(pkg string, trees ...string) bool {
	for _, tr := range trees {
		if pkg == tr || strings.HasPrefix(pkg, tr+"/") {
			return true
		}
	}
	return false
}

// harnessUsers may depend on the harnesses: the harnesses themselves, the
// end-to-end tests, and the programs that run a whole installation on one
// machine (the demo, the benchmark and the chaos soak).
var harnessUsers = []string{"test", "test/e2e", "services/atoll-demo", "services/atoll-bench", "services/atoll-soak"}

func TestImportsPointDown(t *testing.T) {
	rules := []struct {
		name   string
		from   func(pkg string) bool
		forbid []string // import-path prefixes, module-relative or absolute
	}{
		{
			name:   "runtime code never imports a test harness",
			from:   func(p string) bool { return !under(p, harnessUsers...) },
			forbid: []string{module + "test", "testing"},
		},
		{
			name:   "the edge holds no Kubernetes client and no cloud code",
			from:   func(p string) bool { return under(p, "edge", "services/atoll-edge") },
			forbid: []string{"k8s.io/client-go", "sigs.k8s.io/controller-runtime", module + "cloud"},
		},
		{
			name:   "the cloud talks to the edge only through events",
			from:   func(p string) bool { return under(p, "cloud", "services/atoll-cloud") },
			forbid: []string{module + "edge"},
		},
		{
			name:   "events and schemas know nothing of the components",
			from:   func(p string) bool { return under(p, "events", "schemas") },
			forbid: []string{module + "cloud", module + "edge", module + "services", module + "internal"},
		},
		{
			name:   "runtime libraries in internal/ import no component",
			from:   func(p string) bool { return under(p, "internal") && !under(p, harnessUsers...) },
			forbid: []string{module + "cloud", module + "edge", module + "services"},
		},
		{
			name:   "nothing imports a service's main package",
			from:   func(string) bool { return true },
			forbid: []string{module + "services"},
		},
	}
	all := deps(t)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			for pkg, ds := range all {
				if !r.from(pkg) {
					continue
				}
				for _, d := range ds {
					for _, f := range r.forbid {
						if d == f || strings.HasPrefix(d, f+"/") {
							t.Errorf("%s depends on %s", pkg, d)
						}
					}
				}
			}
		})
	}
}

// TestTestsPointDown: the tests of a component import what its own code
// may, and the harnesses: a cloud package's tests never import the edge,
// nor an edge package's the cloud; what crosses both lives in
// test/integration and test/e2e. No test imports a service's main
// package but its own.
func TestTestsPointDown(t *testing.T) {
	rules := []struct {
		name   string
		from   func(pkg string) bool
		forbid []string
	}{
		{"cloud tests never import the edge", func(p string) bool { return under(p, "cloud", "services/atoll-cloud") }, []string{module + "edge"}},
		{"edge tests never import the cloud", func(p string) bool { return under(p, "edge", "services/atoll-edge") }, []string{module + "cloud"}},
		{"runtime libraries' tests import no component", func(p string) bool { return under(p, "internal", "events", "schemas") }, []string{module + "cloud", module + "edge", module + "services"}},
	}
	all := imports(t, true)
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			for pkg, ds := range all {
				if !r.from(pkg) {
					continue
				}
				for _, d := range ds {
					for _, f := range r.forbid {
						if d == f || strings.HasPrefix(d, f+"/") {
							t.Errorf("%s's tests import %s", pkg, d)
						}
					}
				}
			}
		})
	}
	for pkg, ds := range all {
		for _, d := range ds {
			if rel, ok := strings.CutPrefix(d, module); ok && under(rel, "services") && rel != pkg {
				t.Errorf("%s's tests import %s", pkg, d)
			}
		}
	}
}

// harnessStarts is what each harness may import of the module, besides
// the wire contract (events, schemas) and the runtime libraries
// (internal/): only what it is meant to start. The integration and
// end-to-end tests (test/integration, test/e2e) may import anything.
var harnessStarts = map[string][]string{
	"test/poll":     nil,
	"test/freeport": nil,
	"test/layout":   nil,
	"test/promtest": nil,
	// Builds the module's programs; imports none of them.
	"test/gobuild":  nil,
	"test/kubetest": {"test/freeport", "test/poll"},
	"test/crds":     {"deploy", "test/kubetest"},
	// The hub, the credentials it trusts, and edge NATS servers.
	"test/natstest": {"cloud/hub", "cloud/identity", "edge/natsnode", "test/freeport"},
	// Simulated kubelets: no Atoll component.
	"test/edgesim": nil,
	// Emulated edge servers' leaf links: speaks the leafnode protocol
	// itself, starts nothing of the module.
	"test/leafemu": nil,
	// Real nodes (kubelet, containerd) on a kubetest control plane.
	"test/kubenode": {"test/kubetest", "test/poll"},
	// The programs of its images: nothing of the module.
	"test/kubenode/images/hello": nil,
	"test/kubenode/images/pause": nil,
	// Real edge agents on simulated nodes.
	"test/sitesim": {"edge", "test/edgesim"},
	// A whole installation: the control plane, atoll-cloud, the sites.
	"test/testbed": {"cloud", "edge", "deploy", "test/edgesim", "test/gobuild", "test/kubetest", "test/natstest", "test/sitesim"},
	// Atoll installed as pods on real nodes: its manifests and images.
	"test/podbed": {"deploy", "test/kubenode", "test/kubetest", "test/poll"},
	// The chaos soak: faults played on a podbed installation, and its
	// checker.
	"test/chaos": {"test/gobuild", "test/kubenode", "test/kubetest", "test/podbed", "test/poll"},
}

// TestHarnessesStartOnlyTheirOwn: each harness imports only what
// harnessStarts allows it; a new harness must say what it starts.
func TestHarnessesStartOnlyTheirOwn(t *testing.T) {
	for pkg, ds := range imports(t, false) {
		if !under(pkg, "test") || under(pkg, "test/integration", "test/e2e") {
			continue
		}
		allowed, ok := harnessStarts[pkg]
		if !ok {
			t.Errorf("harness %s is not in harnessStarts: say what it may start", pkg)
			continue
		}
		for _, d := range ds {
			rel, ok := strings.CutPrefix(d, module)
			if !ok || under(rel, "events", "schemas", "internal") {
				continue
			}
			if !under(rel, allowed...) {
				t.Errorf("harness %s imports %s, which it is not meant to start", pkg, rel)
			}
		}
	}
}

// TestProtectIsALeaf keeps the protection rules callable from anywhere (the
// webhook, the health reconciler, the edge endpoints proxy): they depend on
// the standard library, k8s.io/api, k8s.io/apimachinery and
// internal/wellknown only, with those packages' own dependencies.
func TestProtectIsALeaf(t *testing.T) {
	all := deps(t)
	const leaf = "internal/protect"
	ds, ok := all[leaf]
	if !ok {
		t.Fatalf("%s not found", leaf)
	}
	allowed := map[string]bool{}
	for _, root := range []string{"k8s.io/api/core/v1", "k8s.io/api/discovery/v1", module + "internal/wellknown"} {
		allowed[root] = true
		for _, d := range stdOrDeps(t, root) {
			allowed[d] = true
		}
	}
	for _, d := range ds {
		switch {
		case allowed[d], !strings.Contains(strings.Split(d, "/")[0], "."): // the standard library
		case strings.HasPrefix(d, "k8s.io/api/"), strings.HasPrefix(d, "k8s.io/apimachinery/"), d == module+"internal/wellknown":
		default:
			t.Errorf("%s depends on %s", leaf, d)
		}
	}
}

// stdOrDeps lists the transitive dependencies of an external package.
func stdOrDeps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", `{{range .Deps}}{{.}} {{end}}`, pkg).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}
