package proxy

import (
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// a1Netns is simulated node a1's network namespace (named after prefix):
// backends answering their node's name on 10.244.1.1 (a1), 10.244.1.2
// (a2) and 10.244.2.1 (b1), port 8080, Services routed to 10.96.0.0/16,
// and an address free inside it for the proxy.
func a1Netns(t *testing.T, prefix string) (*netns, string) {
	t.Helper()
	ns := newNetns(t, fmt.Sprintf("%s-%d", prefix, os.Getpid()%10000))
	ns.addr("192.168.77.1/24")
	for ip, node := range map[string]string{"10.244.1.1": "a1", "10.244.1.2": "a2", "10.244.2.1": "b1"} {
		ns.addr(ip + "/32")
		backend(t, ns.listen(ip+":8080"), node)
	}
	ns.ip("-n", ns.name, "route", "add", "10.96.0.0/16", "dev", "dummy0")
	var addr string
	if err := ns.do(func() error {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		addr = l.Addr().String()
		return l.Close()
	}); err != nil {
		t.Fatal(err)
	}
	return ns, addr
}

// a1Link is node a1's edge server in unit u1 on rh, and its link.
func a1Link(t *testing.T, rh *viewsHub) (*natsnode.Node, *hublink.Link) {
	t.Helper()
	edge := natstest.Unit(t, rh, "u1", natstest.EdgeOptions{}, "a1")[0]
	nc, err := edge.Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, rh.Domain())
	if err != nil {
		t.Fatal(err)
	}
	return edge, hublink.Of(nc, js)
}

// kubeProxyNode is a1Netns with the real kube-proxy reading a hub-fed
// proxy of a1.
func kubeProxyNode(t *testing.T, rh *viewsHub) *netns {
	t.Helper()
	bin := kubeProxyBinary(t)
	edge, link := a1Link(t, rh)
	ns, addr := a1Netns(t, "atoll-kpp")
	runProxy(t, ns, addr, t.TempDir(), edge, link, nil)
	runKubeProxy(t, bin, ns, "a1", addr)
	return ns
}

// pathNode is a Node with labels and an address.
func pathNode(name, ip string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}}}
}

// pathService is Service default/<name> on ClusterIP ip, port 80 to
// 8080, with topology keys (none when empty).
func pathService(name, ip, keys string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080)}}}}
	if keys != "" {
		s.Annotations = map[string]string{wellknown.TopologyKeysAnnotation: keys}
	}
	return s
}

// endpointIP is the backend address of each node.
var endpointIP = map[string]string{"a1": "10.244.1.1", "a2": "10.244.1.2", "b1": "10.244.2.1"}

// TestKubeProxyRelabel: node a1 (unit u1) moves from zone z1 to z2 and
// back; zone is the topology key of Service web, whose endpoints are on
// a1 and on b1 (unit u2, zone z2). The cloud's two messages of a move,
// a1's Node (its unit's space) and web's slice with its new topology
// (the shared space), arrive a second and a half apart: the slice first
// on the way there, the Node first on the way back. A client on a1
// calls web the whole time on new connections and the ruleset is read
// every 100 ms: not one connection fails, and the ruleset changes once
// each way, from a1's endpoint to a1's and b1's and back.
func TestKubeProxyRelabel(t *testing.T) {
	rh := newViewsHub(t)
	labels := func(unit, zone string) map[string]string {
		return map[string]string{wellknown.LabelUnit: unit, "zone": zone}
	}
	slice := func() *discoveryv1.EndpointSlice {
		return siteSlice("web-1", "web", map[string]string{"a1": endpointIP["a1"], "b1": endpointIP["b1"]})
	}
	rh.publish(t, "u2", pathNode("b1", "192.168.78.1", labels("u2", "z2")))
	rh.publish(t, "u1", pathNode("a1", "192.168.77.1", labels("u1", "z1")), pathNode("a2", "192.168.77.2", labels("u1", "z1")),
		pathService("web", "10.96.0.50", "zone"), slice())
	ns := kubeProxyNode(t, rh)
	waitRules(t, ns, "a1", "web", endpointIP["a1"])
	poll.Eventually(t, 20*time.Second, func() error { _, err := ns.get("http://10.96.0.50/"); return err })

	// The client and the ruleset's reader, until stop.
	var (
		mu       sync.Mutex
		calls    int
		failures []string
		answered = map[string]int{}
		rulesets [][]string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			body, err := ns.get("http://10.96.0.50/")
			mu.Lock()
			calls++
			if err != nil {
				failures = append(failures, time.Now().Format("15:04:05.000")+" "+err.Error())
			} else {
				answered[body]++
			}
			mu.Unlock()
		}
	})
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			got := endpointsOf(ns.ruleset(), "web")
			mu.Lock()
			if len(rulesets) == 0 || !slices.Equal(rulesets[len(rulesets)-1], got) {
				rulesets = append(rulesets, got)
			}
			mu.Unlock()
		}
	})
	pause := func() { time.Sleep(1500 * time.Millisecond) }

	// There: the slice with a1 in z2 first, the Node late.
	pause()
	rh.setNode(pathNode("a1", "192.168.77.1", labels("u1", "z2")))
	rh.publish(t, "u1", slice())
	pause()
	rh.publish(t, "u1", pathNode("a1", "192.168.77.1", labels("u1", "z2")))
	waitRules(t, ns, "a1", "web", endpointIP["a1"], endpointIP["b1"])
	// Back: the Node first, the slice late.
	pause()
	rh.publish(t, "u1", pathNode("a1", "192.168.77.1", labels("u1", "z1")))
	pause()
	rh.publish(t, "u1", slice())
	waitRules(t, ns, "a1", "web", endpointIP["a1"])
	pause()
	close(stop)
	wg.Wait()

	t.Logf("%d calls answered by %v; rulesets in turn: %v", calls, answered, rulesets)
	if len(failures) > 0 {
		t.Errorf("%d of %d calls failed; the first: %s", len(failures), calls, strings.Join(failures[:min(5, len(failures))], "; "))
	}
	want := [][]string{{endpointIP["a1"]}, {endpointIP["a1"], endpointIP["b1"]}, {endpointIP["a1"]}}
	if fmt.Sprint(rulesets) != fmt.Sprint(want) {
		t.Errorf("the ruleset held %v in turn, want %v: one change each way", rulesets, want)
	}
	if answered["b1"] == 0 {
		t.Errorf("while a1 was in z2 no call reached b1: %v", answered)
	}
}

// TestKubeProxyFallback: each row of the fallback table
// (docs/traffic.md) with the real kube-proxy: node a1 (unit u1, zone z1,
// region r1) calls Service web, whose keys and endpoints (a2: u1, z2,
// r1; b1: u2, z3, r2) change row by row; the ruleset holds exactly the
// ready endpoints the row names and the client reaches exactly their
// backends (or is refused when none).
func TestKubeProxyFallback(t *testing.T) {
	rh := newViewsHub(t)
	labels := func(unit, zone, region string) map[string]string {
		return map[string]string{wellknown.LabelUnit: unit, "zone": zone, "region": region}
	}
	rh.publish(t, "u2", pathNode("b1", "192.168.78.1", labels("u2", "z3", "r2")))
	rh.publish(t, "u1", pathNode("a1", "192.168.77.1", labels("u1", "z1", "r1")), pathNode("a2", "192.168.77.2", labels("u1", "z2", "r1")))
	ns := kubeProxyNode(t, rh)
	u := wellknown.LabelUnit
	for _, row := range []struct {
		name     string
		keys     string
		ready    []string // nodes with a ready endpoint
		notReady []string // nodes with a not-ready one
		want     []string // the nodes whose backends answer; none: refused
	}{
		{name: "no keys: every endpoint", ready: []string{"a1", "b1"}, want: []string{"a1", "b1"}},
		{name: "unit, some ready in it", keys: u, ready: []string{"a1", "b1"}, notReady: []string{"a2"}, want: []string{"a1"}},
		{name: "unit, none ready in it", keys: u, ready: []string{"b1"}, notReady: []string{"a1"}},
		{name: "unit, none in it", keys: u, ready: []string{"b1"}},
		{name: "unit and star, some ready in it", keys: u + ",*", ready: []string{"a1", "b1"}, want: []string{"a1"}},
		{name: "unit and star, none ready in it", keys: u + ",*", ready: []string{"b1"}, notReady: []string{"a1"}, want: []string{"b1"}},
		{name: "unit and star, none in it", keys: u + ",*", ready: []string{"b1"}, want: []string{"b1"}},
		{name: "zone then region, none ready in the zone", keys: "zone,region", ready: []string{"a2", "b1"}, notReady: []string{"a1"}, want: []string{"a2"}},
		{name: "zone then region, none ready anywhere", keys: "zone,region", notReady: []string{"a1", "a2"}},
	} {
		sl := siteSlice("web-1", "web", map[string]string{})
		for _, n := range slices.Sorted(slices.Values(append(slices.Clone(row.ready), row.notReady...))) {
			sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{endpointIP[n]}, NodeName: ptr.To(n),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(slices.Contains(row.ready, n)), Serving: ptr.To(slices.Contains(row.ready, n)), Terminating: ptr.To(false)}})
		}
		rh.publish(t, "u1", pathService("web", "10.96.0.50", row.keys), sl)
		var ips []string
		for _, n := range row.want {
			ips = append(ips, endpointIP[n])
		}
		slices.Sort(ips)
		poll.Eventually(t, 60*time.Second, func() error {
			if err := rulesHold(ns, "a1", "web", ips...); err != nil {
				return fmt.Errorf("%s: %w", row.name, err)
			}
			return nil
		})
		got := answers(ns, "http://10.96.0.50/", 8*max(1, len(row.want)))
		reached := slices.DeleteFunc(slices.Sorted(maps.Keys(got)), func(k string) bool { return strings.HasPrefix(k, "error: ") })
		switch {
		case len(row.want) == 0 && len(reached) > 0:
			t.Errorf("%s: reached %v, want every call refused", row.name, got)
		case len(row.want) > 0 && !slices.Equal(reached, row.want):
			t.Errorf("%s: answered by %v, want exactly %v", row.name, got, row.want)
		default:
			t.Logf("%s: %v", row.name, got)
		}
	}
}
