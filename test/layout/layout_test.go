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
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, module+"...")
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
// end-to-end tests, and the two programs that run a whole installation on
// one machine (the demo and the benchmark).
var harnessUsers = []string{"test", "test/e2e", "services/atoll-demo", "services/atoll-bench"}

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
