package ipam_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// plugins builds atoll-ipam beside the real host-local (bin/cni, built
// by go tool task node:build) and returns their directory.
func plugins(t *testing.T) string {
	t.Helper()
	// The plugins run in the test's network namespace, which CNI_NETNS
	// names too: skel refuses that unless told it is meant.
	t.Setenv("CNI_NETNS_OVERRIDE", "1")
	hostLocal, err := filepath.Abs("../../bin/cni/host-local")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(hostLocal); err != nil {
		t.Fatalf("host-local not built (go tool task node:build): %v", err)
	}
	dir := t.TempDir()
	if err := os.Symlink(hostLocal, filepath.Join(dir, "host-local")); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(dir, "atoll-ipam"), "github.com/atoll-edge/atoll/services/atoll-ipam").CombinedOutput()
	if err != nil {
		t.Fatalf("build atoll-ipam: %v\n%s", err, out)
	}
	return dir
}

// node is one node's CNI state: the plugins and their data directories.
type node struct {
	t       *testing.T
	bin     string
	conf    []byte
	dataDir string
	store   string
}

func newNode(t *testing.T, bin string) *node {
	dataDir, store := t.TempDir(), t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "pods", "type": "bridge",
  "ipam": {"type": "atoll-ipam", "dataDir": %q,
           "delegate": {"type": "host-local", "dataDir": %q,
                        "ranges": [[{"subnet": "10.9.0.0/24", "rangeStart": "10.9.0.10", "rangeEnd": "10.9.0.12"}]]}}}`, dataDir, store)
	return &node{t: t, bin: bin, conf: []byte(conf), dataDir: dataDir, store: store}
}

func (n *node) args(cmd, sandbox, uid, extra string) *invoke.Args {
	a := "IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME=pod-" + uid + ";K8S_POD_INFRA_CONTAINER_ID=" + sandbox
	if uid != "" {
		a += ";K8S_POD_UID=" + uid
	}
	if extra != "" {
		a += ";" + extra
	}
	return &invoke.Args{Command: cmd, ContainerID: sandbox, NetNS: "/proc/self/ns/net", IfName: "eth0", PluginArgsStr: a, Path: n.bin}
}

// add runs ADD for pod uid's sandbox and returns the address it got.
func (n *node) add(sandbox, uid string, extra ...string) (string, error) {
	res, err := invoke.ExecPluginWithResult(context.Background(), filepath.Join(n.bin, "atoll-ipam"), n.conf,
		n.args("ADD", sandbox, uid, strings.Join(extra, ";")), nil)
	if err != nil {
		return "", err
	}
	r, err := current.NewResultFromResult(res)
	if err != nil || len(r.IPs) != 1 {
		return "", fmt.Errorf("result %v: %v", res, err)
	}
	return r.IPs[0].Address.IP.String(), nil
}

func (n *node) mustAdd(sandbox, uid string, extra ...string) string {
	n.t.Helper()
	ip, err := n.add(sandbox, uid, extra...)
	if err != nil {
		n.t.Fatalf("ADD %s (pod %s): %v", sandbox, uid, err)
	}
	return ip
}

func (n *node) del(sandbox, uid string) {
	n.t.Helper()
	if err := invoke.ExecPluginWithoutResult(context.Background(), filepath.Join(n.bin, "atoll-ipam"), n.conf,
		n.args("DEL", sandbox, uid, ""), nil); err != nil {
		n.t.Fatalf("DEL %s: %v", sandbox, err)
	}
}

// holder is the sandbox host-local reserves ip for.
func (n *node) holder(ip string) string {
	b, err := os.ReadFile(filepath.Join(n.store, "pods", ip))
	if err != nil {
		return ""
	}
	id, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(id)
}

// TestPodKeepsItsAddress drives atoll-ipam over the real host-local as a
// runtime does across a reboot: sandboxes created again without a DEL of
// the old ones (the reboot ended them), late DELs of the old sandboxes,
// an address another pod took meanwhile, a damaged snapshot.
func TestPodKeepsItsAddress(t *testing.T) {
	n := newNode(t, plugins(t))
	a := n.mustAdd("sandbox-a1", "a")
	b := n.mustAdd("sandbox-b1", "b")
	if a == b {
		t.Fatalf("two pods got %s", a)
	}

	// Reboot: both pods get new sandboxes; the old ones were never
	// deleted, so host-local still reserves their addresses.
	if got := n.mustAdd("sandbox-a2", "a"); got != a {
		t.Errorf("pod a after the reboot: %s, want its %s", got, a)
	}
	if got := n.mustAdd("sandbox-b2", "b"); got != b {
		t.Errorf("pod b after the reboot: %s, want its %s", got, b)
	}
	// The runtime deletes the old sandboxes later: the new ones keep
	// their addresses.
	n.del("sandbox-a1", "a")
	n.del("sandbox-b1", "b")
	if h := n.holder(a); h != "sandbox-a2" {
		t.Errorf("%s is reserved for %q after the old sandbox's DEL, want sandbox-a2", a, h)
	}

	// Pod b goes; pod c takes its address (asked for it); b's sandbox comes
	// back: it gets another address and c keeps its.
	n.del("sandbox-b2", "b")
	if got := n.mustAdd("sandbox-c1", "c", "IP="+b); got != b {
		t.Fatalf("pod c asked for %s and got %s", b, got)
	}
	other := n.mustAdd("sandbox-b3", "b")
	if other == b || other == a {
		t.Errorf("pod b came back at %s, held by another pod", other)
	}
	if h := n.holder(b); h != "sandbox-c1" {
		t.Errorf("%s is reserved for %q, want pod c's sandbox-c1", b, h)
	}

	// A pod without a UID (not from a kubelet) is allocated as host-local
	// would, and kept nowhere.
	n.del("sandbox-b3", "b")
	if _, err := n.add("plain", ""); err != nil {
		t.Errorf("ADD without a pod UID: %v", err)
	}
	snap := readSnapshot(t, n)
	if _, ok := snap.Pods[""]; ok {
		t.Error("a sandbox without a pod UID is in the snapshot")
	}

	// A damaged snapshot starts afresh: the ADD still works.
	if err := os.WriteFile(filepath.Join(n.dataDir, "pods.json"), []byte(`{"pods": {"a": `), 0o600); err != nil {
		t.Fatal(err)
	}
	n.del("sandbox-a2", "a")
	if _, err := n.add("sandbox-a3", "a"); err != nil {
		t.Errorf("ADD over a damaged snapshot: %v", err)
	}
	if snap := readSnapshot(t, n); len(snap.Pods) != 1 {
		t.Errorf("snapshot after a damaged one: %v, want pod a alone", snap.Pods)
	}
}

func readSnapshot(t *testing.T, n *node) (s struct {
	Pods map[string]json.RawMessage `json:"pods"`
}) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.dataDir, "pods.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBadConfiguration names what is missing.
func TestBadConfiguration(t *testing.T) {
	bin := plugins(t)
	for conf, want := range map[string]string{
		`{"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "atoll-ipam"}}`:                                     `needs a "delegate"`,
		`{"cniVersion": "1.0.0", "name": "pods", "ipam": {"type": "atoll-ipam", "delegate": {"type": "atoll-ipam"}}}`: "cannot be atoll-ipam itself",
		`{"cniVersion": "1.0.0", "ipam": {"type": "atoll-ipam", "delegate": {"type": "host-local"}}}`:                 `missing network name`,
	} {
		_, err := invoke.ExecPluginWithResult(context.Background(), filepath.Join(bin, "atoll-ipam"), []byte(conf),
			&invoke.Args{Command: "ADD", ContainerID: "x", NetNS: "/proc/self/ns/net", IfName: "eth0", Path: bin}, nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %s", conf, err, want)
		}
	}
}
