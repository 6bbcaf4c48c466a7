package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/kubetest"
)

// uninstallCommands returns the kubectl commands of UPGRADING.md's
// "Uninstalling" section that keep the CRDs (and the grids' workloads),
// in order.
func uninstallCommands(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("UPGRADING.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Uninstalling\n")
	if !ok {
		t.Fatal(`UPGRADING.md has no "## Uninstalling" section`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var cmds []string
	for line := range strings.SplitSeq(section, "\n") {
		if l := strings.TrimSpace(line); strings.HasPrefix(l, "kubectl ") && !strings.Contains(l, " -k ") {
			l, _, _ = strings.Cut(l, "#")
			cmds = append(cmds, strings.TrimSpace(l))
		}
	}
	if len(cmds) == 0 {
		t.Fatal("UPGRADING.md's uninstall section gives no kubectl command")
	}
	return cmds
}

// TestUninstallLeavesNothing installs the default overlay on a real
// control plane (with KCM: the namespace and garbage collectors), runs
// UPGRADING.md's uninstall commands as written, and finds none of the
// installation's objects left but the CRDs, which that path keeps.
func TestUninstallLeavesNothing(t *testing.T) {
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.Start(t, kubetest.WithControllerManager())
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, kubectl, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.KubeconfigPath())
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	overlay := filepath.Join("overlays", "embedded-hub")
	run("apply", "--server-side", "-k", overlay)

	for _, c := range uninstallCommands(t) {
		t.Logf("$ %s", c)
		run(strings.Fields(strings.TrimPrefix(c, "kubectl "))...)
	}

	// Everything the overlay made, but the CRDs.
	rendered := run("kustomize", overlay)
	var kept []string
	for doc := range strings.SplitSeq(rendered, "\n---\n") {
		if !strings.Contains(doc, "\nkind: CustomResourceDefinition\n") {
			kept = append(kept, doc)
		}
	}
	manifest := filepath.Join(t.TempDir(), "installed.yaml")
	if err := os.WriteFile(manifest, []byte(strings.Join(kept, "\n---\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if left := strings.TrimSpace(run("get", "--ignore-not-found", "-o", "name", "-f", manifest)); left != "" {
		t.Errorf("left after the uninstall commands of UPGRADING.md:\n%s", left)
	}
	if got := strings.TrimSpace(run("get", "crd", "-o", "name")); !strings.Contains(got, "atoll.io") {
		t.Errorf("the uninstall that keeps the grids deleted the CRDs: %q", got)
	}
}
