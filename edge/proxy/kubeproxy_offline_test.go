package proxy

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/test/poll"
)

// TestKubeProxyOfflineRestart: the real kube-proxy (nftables mode, in the
// network namespace of node a1 of unit u1) reads the hub-fed proxy; with
// the hub down, the proxy restarts on the same state and address, serves
// the last views within a second, kube-proxy's watches come back to it,
// the ruleset keeps the unit's endpoints all along and a client still
// reaches the Service; when the hub is back, a change of the unit's
// endpoints published then reaches the ruleset.
func TestKubeProxyOfflineRestart(t *testing.T) {
	bin := kubeProxyBinary(t)
	rh := newViewsHub(t)
	rh.publish(t, "u1", siteObjects()...)
	edge, link := a1Link(t, rh)
	// The proxy listens inside the namespace, on an address free there,
	// the same one across its restart.
	ns, addr := a1Netns(t, "atoll-kpr")
	dir := t.TempDir()

	// reaches checks that a client in the namespace reaching url lands on
	// exactly the backends of the nodes want.
	reaches := func(url string, want ...string) {
		t.Helper()
		got := answers(ns, url, 10*len(want))
		if seen := slices.Sorted(maps.Keys(got)); !slices.Equal(seen, want) {
			t.Fatalf("%s answered by %v, want exactly %v", url, got, want)
		}
	}

	m := newMetrics(nil)
	_, stop := runProxy(t, ns, addr, dir, edge, link, m)
	runKubeProxy(t, bin, ns, "a1", addr)
	waitRules(t, ns, "a1", "web", "10.244.1.1")
	waitRules(t, ns, "a1", "plain", "10.244.1.1", "10.244.2.1")
	poll.Eventually(t, 20*time.Second, func() error { _, err := ns.get("http://10.96.0.50/"); return err })
	reaches("http://10.96.0.50/", "a1")
	reaches("http://10.96.0.60/", "a1", "b1")
	watches := int(testutil.ToFloat64(m.watchers))
	if watches < 2 {
		t.Fatalf("kube-proxy holds %d watches on the proxy, want at least services and endpointslices", watches)
	}

	// The hub goes down, then the proxy: kube-proxy keeps its rules.
	rh.Stop()
	stop()
	for svc, want := range map[string][]string{"web": {"10.244.1.1"}, "plain": {"10.244.1.1", "10.244.2.1"}} {
		if err := rulesHold(ns, "a1", svc, want...); err != nil {
			t.Fatalf("with the proxy down: %v", err)
		}
	}

	// The proxy restarts with the hub down: the last views are served
	// within a second.
	m = newMetrics(nil)
	started := time.Now()
	runProxy(t, ns, addr, dir, edge, link, m)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + addr, Dial: ns.dial, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	list, err := cs.DiscoveryV1().EndpointSlices("").List(t.Context(), metav1.ListOptions{})
	served := time.Since(started)
	if err != nil {
		t.Fatalf("list after a restart with the hub down: %v", err)
	}
	got := map[string][]string{}
	for _, sl := range list.Items {
		for _, ep := range sl.Endpoints {
			got[sl.Name] = append(got[sl.Name], *ep.NodeName)
		}
		slices.Sort(got[sl.Name])
	}
	if err := wantView(func() map[string][]string { return got }, map[string][]string{"web-1": {"a1"}, "plain-1": {"a1", "b1"}})(); err != nil {
		t.Fatalf("after a restart with the hub down: %v", err)
	}
	if served > time.Second {
		t.Fatalf("the last views were served %v after the restart, want within 1s", served)
	}
	t.Logf("views served %v after the restart with the hub down", served)

	// kube-proxy's watches come back to the restarted proxy; its rules
	// never changed and the client still lands on the unit's backend.
	poll.Eventually(t, 60*time.Second, func() error {
		if n := int(testutil.ToFloat64(m.watchers)); n < watches {
			return fmt.Errorf("%d watches on the restarted proxy, kube-proxy held %d before", n, watches)
		}
		return nil
	})
	t.Logf("kube-proxy's %d watches back %v after the restart (its requests since: %v lists, %v watches)", watches, time.Since(started),
		testutil.ToFloat64(m.requests.WithLabelValues("list", "200"))-1, testutil.ToFloat64(m.requests.WithLabelValues("watch", "200")))
	for svc, want := range map[string][]string{"web": {"10.244.1.1"}, "plain": {"10.244.1.1", "10.244.2.1"}} {
		if err := rulesHold(ns, "a1", svc, want...); err != nil {
			t.Fatalf("after the restart with the hub down: %v", err)
		}
	}
	reaches("http://10.96.0.50/", "a1")
	reaches("http://10.96.0.60/", "a1", "b1")

	// The hub comes back; a2 joins web's endpoints: the rules follow.
	rh.Start()
	published := time.Now()
	rh.publish(t, "u1", siteSlice("web-1", "web", map[string]string{"a1": "10.244.1.1", "a2": "10.244.1.2", "b1": "10.244.2.1"}))
	poll.Eventually(t, 90*time.Second, func() error { return rulesHold(ns, "a1", "web", "10.244.1.1", "10.244.1.2") })
	t.Logf("the ruleset followed a change %v after it was published to the restarted hub", time.Since(published))
	if err := rulesHold(ns, "a1", "plain", "10.244.1.1", "10.244.2.1"); err != nil {
		t.Fatal(err)
	}
	reaches("http://10.96.0.50/", "a1", "a2")
}
