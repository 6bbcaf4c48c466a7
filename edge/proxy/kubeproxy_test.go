package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/poll"
)

// netns is a network namespace made for the test.
type netns struct {
	t    *testing.T
	name string
}

func newNetns(t *testing.T, name string) *netns {
	t.Helper()
	n := &netns{t: t, name: name}
	_ = exec.Command("ip", "netns", "del", name).Run()
	n.ip("netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	n.ip("-n", name, "link", "set", "lo", "up")
	// A veth pair inside the namespace carries its addresses (the dummy
	// link type needs a kernel module that may be missing).
	n.ip("-n", name, "link", "add", "dummy0", "type", "veth", "peer", "name", "dummy1")
	n.ip("-n", name, "link", "set", "dummy0", "up")
	n.ip("-n", name, "link", "set", "dummy1", "up")
	return n
}

func (n *netns) ip(args ...string) {
	n.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		n.t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
}

func (n *netns) addr(cidr string) {
	n.t.Helper()
	n.ip("-n", n.name, "addr", "add", cidr, "dev", "dummy0")
}

// do runs f on an OS thread inside the namespace; sockets f creates stay
// in it.
func (n *netns) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		fd, err := unix.Open(filepath.Join("/var/run/netns", n.name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}

func (n *netns) listen(addr string) net.Listener {
	n.t.Helper()
	var l net.Listener
	if err := n.do(func() (err error) { l, err = net.Listen("tcp", addr); return err }); err != nil {
		n.t.Fatalf("listen %s in %s: %v", addr, n.name, err)
	}
	n.t.Cleanup(func() { l.Close() })
	return l
}

// dial connects from inside the namespace.
func (n *netns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var conn net.Conn
	err := n.do(func() (err error) { conn, err = (&net.Dialer{}).DialContext(ctx, network, addr); return err })
	return conn, err
}

// get fetches url from inside the namespace, on a new connection.
func (n *netns) get(url string) (string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: n.dial}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func (n *netns) ruleset() string {
	n.t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.name, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		n.t.Fatalf("nft list ruleset: %v\n%s", err, out)
	}
	return string(out)
}

// endpointsOf are the endpoint IPs of Service default/<svc> in a
// kube-proxy nftables ruleset: the DNAT map of its service chain
// ("dnat ip to numgen random mod N map { 0 : IP . port, ... }"), or its
// endpoint chains (older kube-proxy).
func endpointsOf(ruleset, svc string) []string {
	var out []string
	add := func(ip string) {
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	chain := regexp.MustCompile(`chain service-[A-Z0-9]+-default/` + regexp.QuoteMeta(svc) + `/tcp/[^ ]* \{([^}]*\}[^}]*)\}`)
	entry := regexp.MustCompile(`([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+) \. [0-9]+`)
	for _, m := range chain.FindAllStringSubmatch(ruleset, -1) {
		for _, e := range entry.FindAllStringSubmatch(m[1], -1) {
			add(e[1])
		}
	}
	old := regexp.MustCompile(`chain endpoint-[A-Z0-9]+-default/` + regexp.QuoteMeta(svc) + `/tcp/[a-z0-9-]*__([0-9.]+)/`)
	for _, m := range old.FindAllStringSubmatch(ruleset, -1) {
		add(m[1])
	}
	slices.Sort(out)
	return out
}

// waitRules waits until the ruleset of ns (node's) holds exactly the
// endpoints want for Service default/<svc>.
func waitRules(t *testing.T, ns *netns, node, svc string, want ...string) {
	t.Helper()
	poll.Eventually(t, 60*time.Second, func() error { return rulesHold(ns, node, svc, want...) })
}

// rulesHold says how the ruleset of ns differs from holding exactly the
// endpoints want for Service default/<svc>.
func rulesHold(ns *netns, node, svc string, want ...string) error {
	rs := ns.ruleset()
	if got := endpointsOf(rs, svc); !slices.Equal(got, want) {
		var chains []string
		for _, l := range strings.Split(rs, "\n") {
			if strings.Contains(l, "chain ") {
				chains = append(chains, strings.TrimSpace(l))
			}
		}
		return fmt.Errorf("%s: endpoints of %s in the ruleset: %v, want %v; chains: %v", node, svc, got, want, chains)
	}
	return nil
}

// answers fetches url count times from inside ns, each on a new
// connection, and counts the answers (the backends' node names) and
// errors.
func answers(ns *netns, url string, count int) map[string]int {
	got := map[string]int{}
	for range count {
		body, err := ns.get(url)
		if err != nil {
			got["error: "+err.Error()]++
			continue
		}
		got[body]++
	}
	return got
}

// backend serves its node's name on l.
func backend(t *testing.T, l net.Listener, node string) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, node) })}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
}

func kubeProxyBinary(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, nftables)")
	}
	for _, tool := range []string{"nft", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed (go tool task netns:deps)", tool)
		}
	}
	dir := os.Getenv("ATOLL_BIN_DIR")
	if dir == "" {
		dir = "../../bin"
	}
	p, err := filepath.Abs(filepath.Join(dir, "kube-proxy"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skipf("kube-proxy not built (go tool task kube:build, or set ATOLL_BIN_DIR): %v", err)
	}
	return p
}

// runKubeProxy runs the real kube-proxy, nftables mode, in ns, with the
// proxy at apiAddr (inside ns) as its apiserver.
func runKubeProxy(t *testing.T, bin string, ns *netns, node, apiAddr string) {
	t.Helper()
	dir := t.TempDir()
	kc := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: edge, cluster: {server: "http://%s"}}]
users: [{name: kube-proxy, user: {}}]
contexts: [{name: edge, context: {cluster: edge, user: kube-proxy}}]
current-context: edge
`, apiAddr)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: %s
clientConnection: {kubeconfig: %s, contentType: application/vnd.kubernetes.protobuf}
conntrack: {maxPerCore: 0, min: 0}
syncPeriod: 30s
`, node, kc)), 0o600); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "kube-proxy.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", ns.name, bin, "--config", cfg, "--v=2")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			lines := strings.Split(string(b), "\n")
			t.Logf("kube-proxy %s log (last 40 lines):\n%s", node, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
}

// site is the cluster as the cloud sees it: nodes a1, a2 in unit u1, b1
// in u2; Service web with the unit as its topology key, Service plain
// without; endpoints on a1 (10.244.1.1) and b1 (10.244.2.1).
func siteObjects() []objectview.Object {
	node := func(name, unit, ip string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
	}
	svc := func(name, ip, keys string) *corev1.Service {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
				Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
		if keys != "" {
			s.Annotations = map[string]string{wellknown.TopologyKeysAnnotation: keys}
		}
		return s
	}
	return []objectview.Object{
		node("a1", "u1", "192.168.77.1"), node("a2", "u1", "192.168.77.2"), node("b1", "u2", "192.168.78.1"),
		svc("web", "10.96.0.50", wellknown.LabelUnit), svc("plain", "10.96.0.60", ""),
		siteSlice("web-1", "web", map[string]string{"a1": "10.244.1.1", "b1": "10.244.2.1"}),
		siteSlice("plain-1", "plain", map[string]string{"a1": "10.244.1.1", "b1": "10.244.2.1"}),
	}
}

func siteSlice(name, svc string, eps map[string]string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, node := range slices.Sorted(func(yield func(string) bool) {
		for k := range eps {
			if !yield(k) {
				return
			}
		}
	}) {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{eps[node]}, NodeName: ptr.To(node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}})
	}
	return s
}

// TestKubeProxy: the real kube-proxy, nftables mode, in its own network
// namespace per simulated node, reads the proxy of its node: the ruleset
// holds only the unit's endpoints for the topology Service and every
// endpoint for the plain one; when the unit's endpoints change the rules
// follow; a client in the namespace reaching the ClusterIP lands only on
// same-unit backends.
func TestKubeProxy(t *testing.T) {
	bin := kubeProxyBinary(t)
	type simNode struct {
		name  string
		ns    *netns
		store *Store
	}
	var nodes []*simNode
	for i, name := range []string{"a1", "b1"} {
		ns := newNetns(t, fmt.Sprintf("atoll-kp-%d-%s", os.Getpid()%10000, name))
		ns.addr(fmt.Sprintf("192.168.7%d.1/24", 7+i))
		for _, ip := range []string{"10.244.1.1", "10.244.1.2", "10.244.2.1"} {
			ns.addr(ip + "/32")
		}
		ns.ip("-n", ns.name, "route", "add", "10.96.0.0/16", "dev", "dummy0")
		// Backends: every endpoint IP answers the name of its node.
		for ip, node := range map[string]string{"10.244.1.1": "a1", "10.244.1.2": "a2", "10.244.2.1": "b1"} {
			backend(t, ns.listen(ip+":8080"), node)
		}
		store := NewStore(name, 100, nil)
		feed(t, store, siteObjects()...)
		api := NewServer(store, time.Second, slog.New(slog.DiscardHandler))
		l := ns.listen("127.0.0.1:0")
		srv := &http.Server{Handler: api}
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		runKubeProxy(t, bin, ns, name, l.Addr().String())
		nodes = append(nodes, &simNode{name: name, ns: ns, store: store})
	}
	a, b := nodes[0], nodes[1]

	waitRules := func(n *simNode, svc string, want ...string) {
		t.Helper()
		waitRules(t, n.ns, n.name, svc, want...)
	}
	waitRules(a, "web", "10.244.1.1")
	waitRules(a, "plain", "10.244.1.1", "10.244.2.1")
	waitRules(b, "web", "10.244.2.1")
	waitRules(b, "plain", "10.244.1.1", "10.244.2.1")

	// The unit's endpoints change (a2 joins web): the rules follow on
	// a1's node, and b1's stay.
	for _, n := range nodes {
		feed(t, n.store, siteSlice("web-1", "web", map[string]string{"a1": "10.244.1.1", "a2": "10.244.1.2", "b1": "10.244.2.1"}))
	}
	waitRules(a, "web", "10.244.1.1", "10.244.1.2")
	waitRules(b, "web", "10.244.2.1")

	// Clients reach the ClusterIP: web lands only on the unit's backends,
	// plain on all.
	poll.Eventually(t, 20*time.Second, func() error {
		if _, err := a.ns.get("http://10.96.0.50/"); err != nil {
			return err
		}
		return nil
	})
	for _, tc := range []struct {
		n    *simNode
		url  string
		want []string
	}{
		{a, "http://10.96.0.50/", []string{"a1", "a2"}},
		{b, "http://10.96.0.50/", []string{"b1"}},
		{a, "http://10.96.0.60/", []string{"a1", "b1"}},
	} {
		got := answers(tc.n.ns, tc.url, 40)
		if seen := slices.Sorted(maps.Keys(got)); !slices.Equal(seen, tc.want) {
			t.Errorf("%s → %s answered by %v, want exactly %v", tc.n.name, tc.url, got, tc.want)
		}
	}
	if t.Failed() {
		t.Log(errors.New("ruleset of a1:\n" + a.ns.ruleset()))
	}
}
