package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/crds"
	"github.com/atoll-edge/atoll/test/gobuild"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// BenchmarkGridPeers runs SuperEdge's grid controller (its
// application-grid-controller v0.9.0, built by `task superedge:build`
// into bin/superedge) and Atoll's (the atoll-cloud binary with its
// production flags, its hub embedded) through the same job, each in a
// process of its own against a fresh etcd and kube-apiserver (the same
// binaries and flags; no KCM, so children get no status and no pods):
// ATOLL_BENCH_UNITS units of one Node (default 20), then
// ATOLL_BENCH_GRIDS DeploymentGrids (default 200) created one after
// another. It reports for each controller:
//
//   - children-s: from the first grid's create until the apiserver
//     announced the last of the grids × units children (a watch);
//   - status-s: until every grid's status covers each unit (Atoll: the
//     generation observed and every unit updated to the revision);
//     SuperEdge writes its status to a subresource its CRD does not
//     have, so its status never completes (not reported);
//   - stack-cpu-s: CPU of the controller, kube-apiserver and etcd until
//     the later of the two, controller-cpu-s its controller's part;
//     quiet-stack-cpu-s and quiet-s: until the controller wrote nothing
//     for 10 s;
//   - writes: the writes of grids, Deployments and Events kube-apiserver
//     counted (apiserver_request_total) until quiet, the benchmark's
//     grid creates left out; failed-writes: those answered with an
//     error, and SuperEdge's status writes to the missing subresource
//     (which kube-apiserver refuses before counting; they are counted
//     from its log, until the end of the steady period); lease-writes:
//     the Lease renewals (kube-apiserver's own and the leader
//     election's);
//   - steady-writes and steady-controller-cpu-s over the
//     ATOLL_BENCH_STEADY that follows (default 5m), Leases left out.
//
// The log splits the writes by verb, resource and response code.
//
//	go tool task superedge:build
//	go test -run '^$' -bench GridPeers -benchtime 1x -count 3 -timeout 120m ./test/e2e/
func BenchmarkGridPeers(b *testing.B) {
	grids := benchInt(b, "ATOLL_BENCH_GRIDS", 200, 1)
	units := benchInt(b, "ATOLL_BENCH_UNITS", 20, 1)
	steady := benchDuration(b, "ATOLL_BENCH_STEADY", 5*time.Minute)
	for _, p := range []gridPeer{superEdgeGrids{}, atollGrids{}} {
		b.Run(p.name(), func(b *testing.B) {
			for b.Loop() {
				runGridPeer(b, p, grids, units, steady)
			}
		})
	}
}

// gridPeer is one grid controller under test.
type gridPeer interface {
	name() string
	// gvr is its DeploymentGrid resource.
	gvr() schema.GroupVersionResource
	// grid is its DeploymentGrid name in namespace ns, one child per
	// unit.
	grid(ns, name string) *unstructured.Unstructured
	// start runs the controller against c and returns once it serves.
	start(b *testing.B, c *kubetest.Cluster) *exec.Cmd
	// complete reports whether a grid's status covers each of units.
	complete(g *unstructured.Unstructured, units int) bool
	// refused counts its writes kube-apiserver refused without counting
	// them in its request metrics.
	refused(b *testing.B, c *kubetest.Cluster) int
}

func runGridPeer(b *testing.B, p gridPeer, grids, units int, steady time.Duration) {
	ctx := b.Context()
	c := kubetest.Start(b)
	const ns = "bench"
	for _, n := range []string{ns, "atoll-system"} {
		if err := c.CreateNamespace(ctx, n); err != nil {
			b.Fatal(err)
		}
	}
	for u := range units {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("u%d-1", u),
			// SuperEdge writes its key into a label value: no "/".
			Labels: map[string]string{wellknown.LabelUnit: fmt.Sprintf("u%d", u), superEdgeKey: fmt.Sprintf("u%d", u)},
		}}
		if _, err := c.Client().CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ctl := p.start(b, c)
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}

	// Every child as the apiserver announces it, every grid status.
	children := make(chan struct{}, grids*units)
	dw, err := c.Client().AppsV1().Deployments(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer dw.Stop()
	go func() {
		seen := map[string]bool{}
		for ev := range dw.ResultChan() {
			if o, ok := ev.Object.(metav1.Object); ok && ev.Type == watch.Added && !seen[o.GetName()] {
				seen[o.GetName()] = true
				children <- struct{}{}
			}
		}
	}()
	statuses := make(chan struct{}, grids)
	gw, err := dyn.Resource(p.gvr()).Namespace(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer gw.Stop()
	go func() {
		done := map[string]bool{}
		for ev := range gw.ResultChan() {
			g, ok := ev.Object.(*unstructured.Unstructured)
			if ok && !done[g.GetName()] && p.complete(g, units) {
				done[g.GetName()] = true
				statuses <- struct{}{}
			}
		}
	}()

	cpu := func() time.Duration {
		m := c.CPU()
		return m["etcd"] + m["kube-apiserver"] + kubetest.ProcessCPU(ctl.Process.Pid)
	}
	ctl0 := kubetest.ProcessCPU(ctl.Process.Pid)
	w0 := apiserverWrites(b, c)
	cpu0 := cpu()
	start := time.Now()
	for i := range grids {
		if _, err := dyn.Resource(p.gvr()).Namespace(ns).Create(ctx, p.grid(ns, fmt.Sprintf("g%d", i)), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	timeout := time.After(15 * time.Minute)
	for range grids * units {
		select {
		case <-children:
		case <-timeout:
			b.Fatalf("%s: children not all there after 15 min", p.name())
		}
	}
	childrenAt := time.Since(start)
	statusAt := time.Duration(0)
	if _, ok := p.(atollGrids); ok {
		for range grids {
			select {
			case <-statuses:
			case <-timeout:
				b.Fatalf("%s: statuses not all complete after 15 min", p.name())
			}
		}
		statusAt = time.Since(start)
	}
	cpuDone, ctlDone := cpu(), kubetest.ProcessCPU(ctl.Process.Pid)

	// Until the controller writes nothing for 10 s.
	last := apiserverWrites(b, c)
	quietSince := time.Now()
	for time.Since(quietSince) < 10*time.Second && time.Since(start) < 15*time.Minute {
		time.Sleep(time.Second)
		now := apiserverWrites(b, c)
		if now.total(false) != last.total(false) {
			quietSince = time.Now()
		}
		last = now
	}
	quietAt := quietSince.Sub(start)
	cpuQuiet := cpu()
	wq := apiserverWrites(b, c)
	writes := wq.sub(w0)

	ctlQuiet := kubetest.ProcessCPU(ctl.Process.Pid)
	time.Sleep(steady) // measuring a quiet period, not waiting for a state
	ws := apiserverWrites(b, c).sub(wq)
	ctlSteady := kubetest.ProcessCPU(ctl.Process.Pid) - ctlQuiet

	b.ReportMetric(childrenAt.Seconds(), "children-s")
	if statusAt > 0 {
		b.ReportMetric(statusAt.Seconds(), "status-s")
	}
	b.ReportMetric((cpuDone - cpu0).Seconds(), "stack-cpu-s")
	b.ReportMetric((ctlDone - ctl0).Seconds(), "controller-cpu-s")
	b.ReportMetric((cpuQuiet - cpu0).Seconds(), "quiet-stack-cpu-s")
	b.ReportMetric(quietAt.Seconds(), "quiet-s")
	b.ReportMetric(float64(writes.total(false)-grids), "writes")
	b.ReportMetric(float64(writes.failed()+p.refused(b, c)), "failed-writes")
	b.ReportMetric(float64(writes.leases()), "lease-writes")
	b.ReportMetric(float64(ws.total(false)), "steady-writes")
	b.ReportMetric(ctlSteady.Seconds(), "steady-controller-cpu-s")
	b.Logf("%s: %d grids x %d units; writes until quiet by verb, resource and code (the benchmark's %d grid creates included): %s; in the %v after: %s",
		p.name(), grids, units, grids, writes, steady, ws)
}

// requestCounts are kube-apiserver's apiserver_request_total write
// series of the resources the grid controllers write (grids, their
// children, Events, Leases): "VERB resource[/subresource] code" → count.
type requestCounts map[string]float64

var requestLine = regexp.MustCompile(`^apiserver_request_total\{(.*)\} (\S+)$`)

var labelPair = regexp.MustCompile(`(\w+)="([^"]*)"`)

// apiserverWrites reads the write requests kube-apiserver counted.
func apiserverWrites(b *testing.B, c *kubetest.Cluster) requestCounts {
	body, err := c.Client().CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(b.Context())
	if err != nil {
		b.Fatalf("kube-apiserver /metrics: %v", err)
	}
	out := requestCounts{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		m := requestLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		l := map[string]string{}
		for _, p := range labelPair.FindAllStringSubmatch(m[1], -1) {
			l[p[1]] = p[2]
		}
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE":
		default:
			continue
		}
		switch l["resource"] {
		case "deploymentgrids", "deployments", "events", "leases":
		default:
			continue // kube-apiserver's own (its Endpoints, say)
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			continue
		}
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		out[l["verb"]+" "+res+" "+l["code"]] += v
	}
	return out
}

func (r requestCounts) sub(base requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range r {
		if d := v - base[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// total counts the writes, Leases only if leases.
func (r requestCounts) total(leases bool) int {
	n := 0.0
	for k, v := range r {
		if leases || !strings.Contains(k, " leases ") {
			n += v
		}
	}
	return int(n)
}

func (r requestCounts) leases() int { return r.total(true) - r.total(false) }

// failed counts the writes answered with an error (4xx, 5xx).
func (r requestCounts) failed() int {
	n := 0.0
	for k, v := range r {
		if code := k[strings.LastIndexByte(k, ' ')+1:]; code >= "400" {
			n += v
		}
	}
	return int(n)
}

func (r requestCounts) String() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(r)) {
		fmt.Fprintf(&b, "%s=%d ", k, int(r[k]))
	}
	return strings.TrimSpace(b.String())
}

// runController starts bin with args, its output in a log file beside
// the cluster's, killed with the benchmark.
func runController(b *testing.B, c *kubetest.Cluster, name, bin string, args ...string) *exec.Cmd {
	return gobuild.Start(b, filepath.Join(c.Dir(), "logs", name+".log"), bin, args...)
}

// superEdgeGrids is SuperEdge's application-grid-controller with its
// defaults (2 workers, 1000 QPS), which installs its own CRDs.
type superEdgeGrids struct{}

func (superEdgeGrids) name() string { return "superedge" }

func (superEdgeGrids) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "superedge.io", Version: "v1", Resource: "deploymentgrids"}
}

// superEdgeKey is the nodes' unit label for SuperEdge, which rejects a
// key with a "/" such as atoll.io/unit.
const superEdgeKey = "unit"

func (superEdgeGrids) grid(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "superedge.io/v1",
		"kind":       "DeploymentGrid",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"gridUniqKey": superEdgeKey,
			"template":    benchTemplate(),
		},
	}}
}

func (p superEdgeGrids) start(b *testing.B, c *kubetest.Cluster) *exec.Cmd {
	dir := filepath.Join(c.BinDir(), "superedge")
	bin := filepath.Join(dir, "application-grid-controller")
	if _, err := os.Stat(bin); err != nil {
		b.Fatalf("%v: build it with go tool task superedge:build", err)
	}
	// Its CRDs, which it creates from the copies its image ships in
	// /etc/superedge.
	manifests, err := filepath.Glob(filepath.Join(dir, "manifests", "*.yaml"))
	if err != nil || len(manifests) == 0 {
		b.Fatalf("no SuperEdge CRD manifests in %s (%v): go tool task superedge:build", dir, err)
	}
	for _, m := range manifests {
		data, err := os.ReadFile(m)
		if err != nil {
			b.Fatal(err)
		}
		objs, err := kubetest.DecodeManifests(m, data)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.Apply(b.Context(), objs, kubetest.ApplyOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	cmd := runController(b, c, "superedge", bin, "--kubeconfig="+c.KubeconfigPath())
	// It serves once its CRD is established and its informers run.
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		b.Fatal(err)
	}
	poll.Eventually(b, time.Minute, func() error {
		_, err := dyn.Resource(p.gvr()).Namespace("default").List(b.Context(), metav1.ListOptions{Limit: 1})
		return err
	})
	time.Sleep(2 * time.Second)
	return cmd
}

// complete: never. It writes a grid's status to the status subresource,
// which its CRD does not have: kube-apiserver answers 404 before its
// request metrics count it (refused counts them from its log).
func (superEdgeGrids) complete(*unstructured.Unstructured, int) bool { return false }

// refused counts the failed syncs its log reports for a grid that is
// "not found": its status writes.
func (superEdgeGrids) refused(b *testing.B, c *kubetest.Cluster) int {
	data, err := os.ReadFile(filepath.Join(c.Dir(), "logs", "superedge.log"))
	if err != nil {
		b.Fatal(err)
	}
	return len(superEdgeRefused.FindAll(data, -1))
}

var superEdgeRefused = regexp.MustCompile(`deploymentgrids\.superedge\.io "[^"]+" not found`)

// atollGrids is atoll-cloud as deployed (its production flags; the hub
// embedded, on free ports).
type atollGrids struct{}

func (atollGrids) name() string { return "atoll" }

func (atollGrids) gvr() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "apps.atoll.io", Version: "v1alpha1", Resource: "deploymentgrids"}
}

func (atollGrids) grid(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps.atoll.io/v1alpha1",
		"kind":       "DeploymentGrid",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       map[string]any{"template": benchTemplate()},
	}}
}

func (atollGrids) start(b *testing.B, c *kubetest.Cluster) *exec.Cmd {
	ctx := b.Context()
	if err := crds.Install(ctx, c); err != nil {
		b.Fatal(err)
	}
	// The Secrets the manifests create empty for atoll-cloud to fill.
	for _, name := range []string{"atoll-cloud-webhook-certs", "atoll-edge-enroll", "atoll-hub-leaf-certs"} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "atoll-system"}}
		if _, err := c.Client().CoreV1().Secrets("atoll-system").Create(ctx, s, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	bin, err := gobuild.Binary(ctx, "services/atoll-cloud")
	if err != nil {
		b.Fatal(err)
	}
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = natstest.FreePort(); err != nil {
			b.Fatal(err)
		}
	}
	dir := b.TempDir()
	admin := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cmd := runController(b, c, "atoll-cloud", bin,
		"--kubeconfig="+c.KubeconfigPath(),
		"--admin-addr="+admin,
		"--webhook-addr="+fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--hub-client-port="+strconv.Itoa(ports[2]),
		"--hub-leaf-port="+strconv.Itoa(ports[3]),
		"--hub-store-dir="+filepath.Join(dir, "hub"),
		"--identity-dir="+filepath.Join(dir, "identity"),
		"--leader-election-namespace=atoll-system",
		"--log-format=json")
	poll.Eventually(b, 2*time.Minute, func() error {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("atoll-cloud /readyz: %s", resp.Status)
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	return cmd
}

func (atollGrids) refused(*testing.B, *kubetest.Cluster) int { return 0 }

// complete: the status observed the grid's generation and lists each of
// units as updated to the current revision.
func (atollGrids) complete(g *unstructured.Unstructured, units int) bool {
	og, _, _ := unstructured.NestedInt64(g.Object, "status", "observedGeneration")
	updated, _, _ := unstructured.NestedStringSlice(g.Object, "status", "rollout", "updated")
	return og == g.GetGeneration() && len(updated) == units
}

// benchTemplate is the children's Deployment spec: one web replica.
func benchTemplate() map[string]any {
	t, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ptr.To(webTemplate("web:v1", 1)))
	if err != nil {
		panic(err)
	}
	return t
}
