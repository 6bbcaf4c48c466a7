package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/views/objects"
	"github.com/atoll-edge/atoll/edge/proxy"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// benchNamespace holds the traffic benchmark's Services.
const benchNamespace = "bench"

type fixedUnit string

func (u fixedUnit) Unit() string           { return string(u) }
func (fixedUnit) Changes() <-chan struct{} { return nil }

// BenchmarkTraffic measures site-local service traffic end to end: a real
// apiserver, the object views publisher (cloud/views/objects, default
// debounce) on a real hub, and ATOLL_BENCH_PROXIES endpoints proxies
// (default 100; edge/proxy, state on disk) spread over ATOLL_BENCH_UNITS
// units (default 10; one edge NATS server per unit, each proxy with its own
// view feed and state, as one agent per node would have; the proxies of a
// unit share their server's leaf, which carries each change once), with ATOLL_BENCH_SERVICES
// Services of one EndpointSlice each (default 1000, half of them
// topology-keyed). It prints:
//
//   - the latency from an EndpointSlice update in the apiserver to the
//     change arriving on a watch of each proxy (p50, p99, max over every
//     proxy and change; and per change, until the last proxy has it), over
//     ATOLL_BENCH_CHANGES changes (default 20);
//   - the bytes sent to an edge per endpoint change: the hub's leaf bytes
//     out during the changes (on the wire: after the leaf link's
//     compression, with the link's heartbeats) per proxy and change,
//     and the size of the view message as stored;
//   - the RSS of an edge process (edge NATS server + endpoints proxy, its
//     own process) before and after it holds the views of the Services,
//     and the size of its proxy's state on disk (snapshot and log).
func BenchmarkTraffic(b *testing.B) {
	proxies := benchInt(b, "ATOLL_BENCH_PROXIES", 100, 1)
	units := benchInt(b, "ATOLL_BENCH_UNITS", 10, 1)
	services := benchInt(b, "ATOLL_BENCH_SERVICES", 1000, 1)
	changes := benchInt(b, "ATOLL_BENCH_CHANGES", 20, 1)
	if units > proxies {
		units = proxies
	}
	for b.Loop() {
		runTrafficBench(b, proxies, units, services, changes)
	}
}

func runTrafficBench(b *testing.B, proxies, units, services, changes int) {
	ctx := b.Context()
	cluster := kubetest.Start(b)
	h := natstest.Hub(b)
	log := natstest.Logger(b, slog.LevelError)
	rc := cluster.RESTConfig()
	rc.QPS, rc.Burst = 1000, 2000
	kc, err := kubernetes.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}

	// The cloud: streams and the object views publisher.
	nc, err := h.Connect("cloud")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		b.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		b.Fatal(err)
	}
	views, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		b.Fatal(err)
	}
	kube.RouteLogs(log) // as atoll-cloud does: no controller-runtime stack trace about an unset logger
	mcfg := manager.DefaultConfig()
	mcfg.LeaderElect = false
	m, err := manager.New(mcfg, rc, log)
	if err != nil {
		b.Fatal(err)
	}
	pub, err := objects.New(objects.DefaultConfig(), m.GetClient(), hublink.Of(nc, js), log, nil, h.Issuer().ViewSigner())
	if err != nil {
		b.Fatal(err)
	}
	if err := pub.SetupWithManager(m); err != nil {
		b.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := m.Start(sctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Stop(context.Background()) })
	runCtx, stop := context.WithCancel(context.Background())
	pubDone := make(chan struct{})
	go func() { defer close(pubDone); _ = pub.Run(runCtx) }()
	b.Cleanup(func() { stop(); <-pubDone })

	// Nodes: one per proxy, round-robin over the units, and the RSS probe's.
	unitOf := func(i int) string { return fmt.Sprintf("u%d", i%units) }
	nodeOf := func(i int) string { return fmt.Sprintf("%s-n%d", unitOf(i), i/units) }
	var nodeNames []string
	for i := range proxies {
		nodeNames = append(nodeNames, nodeOf(i))
	}
	nodeNames = append(nodeNames, "u0-rss")
	parallel(b, len(nodeNames), func(i int) error {
		unit := strings.SplitN(nodeNames[i], "-", 2)[0]
		_, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: nodeNames[i], Labels: map[string]string{wellknown.LabelUnit: unit},
		}}, metav1.CreateOptions{})
		return err
	})
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}

	// The RSS probe: an edge process of its own, holding only the nodes yet.
	probe := startEdgeProcess(b, h, "u0", "u0-rss")
	proxyServes(b, probe.addr, "nodes", "", 1)
	rssBefore := probe.rss(b)

	// The proxies: one edge server per unit, one connection and proxy per node.
	addrs := make([]string, proxies)
	for u := range units {
		unit := fmt.Sprintf("u%d", u)
		edge := natstest.Unit(b, h, unit, natstest.EdgeOptions{}, unit+"-edge")[0]
		for i := u; i < proxies; i += units {
			enc, err := edge.Connect("proxy-" + nodeOf(i))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(enc.Close)
			ejs, err := jetstream.NewWithDomain(enc, h.Domain())
			if err != nil {
				b.Fatal(err)
			}
			cfg := proxy.DefaultConfig()
			cfg.Enabled, cfg.Addr, cfg.StateDir = true, "127.0.0.1:0", b.TempDir()
			link := hublink.Of(enc, ejs)
			feeds, err := viewfeed.NewFeeds(viewfeed.DefaultConfig(), link, edge, log, nil)
			if err != nil {
				b.Fatal(err)
			}
			p, err := proxy.New(cfg, nodeOf(i), feeds, fixedUnit(unit), log, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Listen(); err != nil {
				b.Fatal(err)
			}
			addrs[i] = p.Addr()
			pctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = p.Run(pctx) }()
			b.Cleanup(func() { cancel(); <-done })
		}
	}

	// The Services, each with one slice of two endpoints in two units;
	// the odd ones keyed on the unit label.
	start := time.Now()
	parallel(b, services, func(k int) error {
		name := fmt.Sprintf("s%d", k)
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}
		if k%2 == 1 {
			svc.Annotations = map[string]string{wellknown.TopologyKeysAnnotation: wellknown.LabelUnit}
		}
		if _, err := kc.CoreV1().Services(benchNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := kc.DiscoveryV1().EndpointSlices(benchNamespace).Create(ctx, benchSlice(name, k, nodeOf(k%proxies), nodeOf((k+1)%proxies), "10.200.0.1"), metav1.CreateOptions{})
		return err
	})
	created := time.Since(start)
	for i, a := range addrs {
		proxyServes(b, a, "endpointslices", benchNamespace, services)
		if i == 0 {
			b.Logf("proxy 0 serves the %d slices %v after the first create", services, time.Since(start).Round(time.Millisecond))
		}
	}
	proxyServes(b, probe.addr, "endpointslices", benchNamespace, services)
	loaded := time.Since(start)
	rssAfter := probe.rss(b)
	probe.stop()
	snapBytes, logBytes := probe.stateSize(b)

	// Watches of s0's slice on every proxy.
	type seen struct {
		proxy, change int
		at            time.Time
	}
	seenCh := make(chan seen, proxies*4)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wg sync.WaitGroup
	for i, a := range addrs {
		rv := listRV(b, a)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = watchSlice(wctx, a, rv, "s0-1", func(addr string, at time.Time) {
				if k, ok := strings.CutPrefix(addr, "10.250."); ok {
					parts := strings.Split(k, ".")
					n, _ := strconv.Atoi(parts[0])
					lo, _ := strconv.Atoi(parts[1])
					seenCh <- seen{i, n*256 + lo, at}
				}
			})
		}()
	}
	// Every watch is open once a first change reaches them all.
	leafBytes := func() int64 {
		lz, err := h.Server().Leafz(&server.LeafzOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var n int64
		for _, l := range lz.Leafs {
			n += l.OutBytes
		}
		return n
	}
	var (
		all     []time.Duration
		perLast []time.Duration
	)
	change := func(k int) (time.Time, []time.Duration) {
		slice, err := kc.DiscoveryV1().EndpointSlices(benchNamespace).Get(ctx, "s0-1", metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		slice.Endpoints[0].Addresses = []string{fmt.Sprintf("10.250.%d.%d", k/256, k%256)}
		t0 := time.Now()
		if _, err := kc.DiscoveryV1().EndpointSlices(benchNamespace).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		got := map[int]time.Duration{}
		deadline := time.After(2 * time.Minute)
		for len(got) < proxies {
			select {
			case s := <-seenCh:
				if s.change == k {
					if _, dup := got[s.proxy]; !dup {
						got[s.proxy] = s.at.Sub(t0)
					}
				}
			case <-deadline:
				b.Fatalf("change %d reached %d of %d proxies in 2 minutes", k, len(got), proxies)
			}
		}
		var lat []time.Duration
		for _, d := range got {
			lat = append(lat, d)
		}
		return t0, lat
	}
	change(1) // warm-up: every watch is established
	bytesBefore := leafBytes()
	for k := 2; k < changes+2; k++ {
		_, lat := change(k)
		all = append(all, lat...)
		perLast = append(perLast, slices.Max(lat))
	}
	bytesOut := leafBytes() - bytesBefore
	wcancel()
	wg.Wait()

	viewMsg, err := views.GetLastMsgForSubject(ctx, mustSubject(b, events.SharedSpace, objectview.KindEndpointSlices, benchNamespace, "s0-1"))
	if err != nil {
		b.Fatal(err)
	}
	viewSize := len(viewMsg.Data)
	for k, v := range viewMsg.Header {
		viewSize += len(k) + len(strings.Join(v, ","))
	}
	perProxy := float64(bytesOut) / float64(changes) / float64(proxies)

	fmt.Printf("\nBenchmarkTraffic: %d proxies in %d units, %d Services (%d topology-keyed), %d changes of one EndpointSlice\n",
		proxies, units, services, services/2, changes)
	fmt.Printf("%-62s %s\n", "setup: Services + slices created in", created.Round(time.Millisecond))
	fmt.Printf("%-62s %s\n", "setup: every proxy serves every slice after", loaded.Round(time.Millisecond))
	fmt.Printf("%-62s p50 %-8s p99 %-8s max %s\n", "latency apiserver update → watch event, per proxy:",
		pct(all, 50), pct(all, 99), pct(all, 100))
	fmt.Printf("%-62s p50 %-8s p99 %-8s max %s\n", "latency until the last of the proxies has it, per change:",
		pct(perLast, 50), pct(perLast, 99), pct(perLast, 100))
	fmt.Printf("%-62s %.0f B\n", "hub → edge leaf bytes (wire) per endpoint change, per proxy:", perProxy)
	fmt.Printf("%-62s %d B\n", "the slice's view message (payload + headers):", viewSize)
	fmt.Printf("%-62s %.1f MiB → %.1f MiB (peak %.1f MiB)\n", fmt.Sprintf("edge process RSS, nodes only → %d Services:", services),
		mib(rssBefore.rss), mib(rssAfter.rss), mib(rssAfter.hwm))
	fmt.Printf("%-62s %.0f KiB (snapshot %.0f KiB, log %.0f KiB)\n", fmt.Sprintf("edge proxy state on disk, %d Services:", services),
		float64(snapBytes+logBytes)/1024, float64(snapBytes)/1024, float64(logBytes)/1024)
	b.ReportMetric(float64(pctDur(all, 50).Milliseconds()), "p50-ms")
	b.ReportMetric(float64(pctDur(all, 99).Milliseconds()), "p99-ms")
	b.ReportMetric(perProxy, "B/change/edge")
	b.ReportMetric(mib(rssAfter.rss), "edge-RSS-MiB")
}

// benchSlice is the EndpointSlice of Service svc: endpoints on nodes a
// (with address first) and b.
func benchSlice(svc string, k int, a, b, first string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-1", Namespace: benchNamespace, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{first}, NodeName: ptr.To(a), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
			{Addresses: []string{fmt.Sprintf("10.201.%d.%d", k/256, k%256)}, NodeName: ptr.To(b), Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}},
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](80)}},
	}
}

// parallel runs f(0..n-1) on 16 workers and fails b on the first error.
func parallel(b *testing.B, n int, f func(int) error) {
	b.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	next := make(chan int)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d failed, first: %v", len(errs), n, errs[0])
	}
}

// proxyServes waits until the proxy at addr lists n objects of resource
// (a core resource, or endpointslices) in namespace ("" all).
func proxyServes(b *testing.B, addr, resource, namespace string, n int) {
	b.Helper()
	path := "/api/v1/"
	if resource == "endpointslices" {
		path = "/apis/discovery.k8s.io/v1/"
	}
	if namespace != "" {
		path += "namespaces/" + namespace + "/"
	}
	path += resource
	poll.Eventually(b, 10*time.Minute, func() error {
		var list struct {
			Items []json.RawMessage `json:"items"`
		}
		if err := getJSON(b.Context(), "http://"+addr+path, &list); err != nil {
			return err
		}
		if len(list.Items) < n {
			return fmt.Errorf("%s serves %d of %d %s", addr, len(list.Items), n, resource)
		}
		return nil
	})
}

func getJSON(ctx context.Context, u string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// listRV is the resource version of the proxy's list of s0's slice.
func listRV(b *testing.B, addr string) string {
	b.Helper()
	var list discoveryv1.EndpointSliceList
	u := "http://" + addr + "/apis/discovery.k8s.io/v1/namespaces/" + benchNamespace + "/endpointslices?fieldSelector=" + url.QueryEscape("metadata.name=s0-1")
	if err := getJSON(b.Context(), u, &list); err != nil {
		b.Fatal(err)
	}
	return list.ResourceVersion
}

// watchSlice watches the slice name on the proxy at addr from rv and calls
// seen with its first endpoint's address and the time of each event.
func watchSlice(ctx context.Context, addr, rv, name string, seen func(string, time.Time)) error {
	u := "http://" + addr + "/apis/discovery.k8s.io/v1/namespaces/" + benchNamespace + "/endpointslices?watch=1&resourceVersion=" + rv +
		"&fieldSelector=" + url.QueryEscape("metadata.name="+name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev metav1.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			return err
		}
		at := time.Now()
		var s discoveryv1.EndpointSlice
		if err := json.Unmarshal(ev.Object.Raw, &s); err != nil {
			continue
		}
		for _, e := range s.Endpoints {
			if len(e.Addresses) > 0 {
				seen(e.Addresses[0], at)
			}
		}
	}
}

func mustSubject(b *testing.B, unit, kind, ns, name string) string {
	s, err := objectview.Subject(unit, kind, ns, name)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func pctDur(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p+99)/100 - 1
	return s[max(0, min(i, len(s)-1))]
}

func pct(d []time.Duration, p int) string { return pctDur(d, p).Round(time.Millisecond).String() }

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// edgeProcess is the RSS probe: this test binary re-run as
// TestTrafficEdgeProcess, an edge NATS server and endpoints proxy in a
// process of their own.
type edgeProcess struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
	dir   string // its state directory
	once  sync.Once
}

// stateSize is the size of the proxy's state files in the process's state
// directory: the snapshot and the log.
func (p *edgeProcess) stateSize(b *testing.B) (snapshot, log int64) {
	b.Helper()
	for _, f := range []struct {
		name string
		n    *int64
	}{{proxy.StateFile, &snapshot}, {proxy.LogFile, &log}} {
		fi, err := os.Stat(filepath.Join(p.dir, f.name))
		if err != nil && !os.IsNotExist(err) {
			b.Fatal(err)
		}
		if err == nil {
			*f.n = fi.Size()
		}
	}
	return snapshot, log
}

type memory struct{ rss, hwm int64 }

func startEdgeProcess(b *testing.B, h *hub.Hub, unit, node string) *edgeProcess {
	b.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		b.Fatal(err)
	}
	seed, _ := kp.Seed()
	pubKey, _ := kp.PublicKey()
	jwt, err := h.IssueEdge(node, unit, pubKey)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestTrafficEdgeProcess$", "-test.bench=^$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		"ATOLL_TRAFFIC_EDGE=1", "ATOLL_TRAFFIC_EDGE_LEAF="+strings.Join(h.LeafURLs(), ","),
		"ATOLL_TRAFFIC_EDGE_DOMAIN="+h.Domain(), "ATOLL_TRAFFIC_EDGE_UNIT="+unit, "ATOLL_TRAFFIC_EDGE_NODE="+node,
		"ATOLL_TRAFFIC_EDGE_SEED="+string(seed), "ATOLL_TRAFFIC_EDGE_JWT="+jwt, "ATOLL_TRAFFIC_EDGE_DIR="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &edgeProcess{cmd: cmd, stdin: stdin, dir: dir}
	b.Cleanup(p.stop)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "ATOLL_TRAFFIC_EDGE_ADDR "); ok {
				addr <- a
			}
		}
	}()
	select {
	case p.addr = <-addr:
	case <-time.After(2 * time.Minute):
		b.Fatal("the edge process did not start its proxy within 2 minutes")
	}
	return p
}

func (p *edgeProcess) stop() {
	p.once.Do(func() {
		_ = p.stdin.Close() // the process ends when its stdin does
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
}

func (p *edgeProcess) rss(b *testing.B) memory {
	b.Helper()
	raw, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status"))
	if err != nil {
		b.Fatal(err)
	}
	var m memory
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb << 10
		case "VmHWM:":
			m.hwm = kb << 10
		}
	}
	return m
}

type leafHub []string

func (leafHub) IssueEdge(string, string, string) (string, error) {
	return "", fmt.Errorf("the edge process does not issue credentials")
}
func (h leafHub) LeafURLs() []string { return h }

// TestTrafficEdgeProcess is BenchmarkTraffic's edge process (skipped
// otherwise): an edge NATS server and an endpoints proxy for the unit and
// node it is given, until its stdin closes.
func TestTrafficEdgeProcess(t *testing.T) {
	if os.Getenv("ATOLL_TRAFFIC_EDGE") == "" {
		t.Skip("run by BenchmarkTraffic")
	}
	unit, node := os.Getenv("ATOLL_TRAFFIC_EDGE_UNIT"), os.Getenv("ATOLL_TRAFFIC_EDGE_NODE")
	log := natstest.Logger(t, slog.LevelError)
	edge := natstest.Edge(t, leafHub(strings.Split(os.Getenv("ATOLL_TRAFFIC_EDGE_LEAF"), ",")), node, natstest.EdgeOptions{
		Unit: unit, Seed: os.Getenv("ATOLL_TRAFFIC_EDGE_SEED"), UserJWT: os.Getenv("ATOLL_TRAFFIC_EDGE_JWT"), Logger: log,
	})
	natstest.SetMesh(t, unit, edge)
	nc, err := edge.Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, os.Getenv("ATOLL_TRAFFIC_EDGE_DOMAIN"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxy.DefaultConfig()
	cfg.Enabled, cfg.Addr, cfg.StateDir = true, "127.0.0.1:0", os.Getenv("ATOLL_TRAFFIC_EDGE_DIR")
	link := hublink.Of(nc, js)
	feeds, err := viewfeed.NewFeeds(viewfeed.DefaultConfig(), link, edge, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(cfg, node, feeds, fixedUnit(unit), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	fmt.Printf("ATOLL_TRAFFIC_EDGE_ADDR %s\n", p.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	<-done
}
