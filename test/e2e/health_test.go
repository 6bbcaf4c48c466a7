// Package e2e runs Atoll end to end against the real components: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler built from the
// pinned modules, the real NATS fabric, and a real atoll-edge agent per
// simulated node.
package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/atoll-edge/atoll/test/poll"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/testbed"
)

const (
	toleration = 10 * time.Second // pods' unreachable toleration (kubetest default)
	holdTime   = 25 * time.Second
)

// faults blocks probes between pairs of nodes of one bed: a network
// partition inside a unit, as the probers see it. Each bed has its own
// table (beds run at once and reuse node names).
type faults struct {
	name    string
	mu      sync.Mutex
	blocked map[[2]string]bool
}

// faultTables are the beds' tables by name, for the agents' probe
// plugin.
var faultTables sync.Map

// newFaults makes an empty table for the bed of test t.
func newFaults(t testing.TB) *faults {
	f := &faults{name: t.Name(), blocked: map[[2]string]bool{}}
	faultTables.Store(f.name, f)
	t.Cleanup(func() { faultTables.Delete(f.name) })
	return f
}

func (f *faults) block(a, b string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.blocked[[2]string{a, b}], f.blocked[[2]string{b, a}] = true, true
}

func (f *faults) unblock(a, b string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.blocked, [2]string{a, b})
	delete(f.blocked, [2]string{b, a})
}

func (f *faults) isBlocked(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[[2]string{a, b}]
}

// agents makes every probe of an agent also pass through the table: a
// peer must pass all three plugins to be normal.
func (f *faults) agents(c *edgeapp.Config) {
	c.Prober.Plugins = append(c.Prober.Plugins, prober.PluginConfig{
		Kind: "fault", Name: "in-unit-network", Weight: 1, Timeout: 500 * time.Millisecond,
		Args: map[string]string{"checker": c.NATS.NodeName, "table": f.name},
	})
	c.Prober.Scoreline = 200
}

type faultPlugin struct {
	checker string
	table   *faults
}

func (p faultPlugin) Check(_ context.Context, t prober.Target) error {
	if p.table.isBlocked(p.checker, t.Name) {
		return fmt.Errorf("%s cannot reach %s", p.checker, t.Name)
	}
	return nil
}

func TestMain(m *testing.M) {
	prober.Register("fault", func(c prober.PluginConfig) (prober.Plugin, error) {
		f, ok := faultTables.Load(c.Args["table"])
		if !ok {
			return nil, fmt.Errorf("no fault table %q", c.Args["table"])
		}
		return faultPlugin{checker: c.Args["checker"], table: f.(*faults)}, nil
	})
	os.Exit(m.Run())
}

type env struct {
	bed    *testbed.Bed
	client kubernetes.Interface
	// faults partitions the bed's units as their probers see it.
	faults *faults
	// logPath is the bed's log; auditDir holds the apiserver's audit log
	// of every request atoll-cloud's ServiceAccount made.
	logPath, auditDir string
	// formed counts the matrix's scenarios whose sites are formed: the
	// hub server is killed once every unit is formed, so the kill tests
	// keeping formed units serving (forming a unit while a hub server
	// dies can take minutes: see the edge convergence issue).
	formed sync.WaitGroup
}

// hubShape is how the hub runs under a bed.
type hubShape struct {
	name string
	// cluster: three hub servers that atoll-cloud dials by URL, R3
	// streams; otherwise the hub embedded in atoll-cloud.
	cluster bool
	// net separates the beds' loopback addresses.
	net int
}

var (
	embeddedHub = hubShape{name: "embedded hub", net: 2}
	hubCluster  = hubShape{name: "hub cluster", cluster: true, net: 3}
)

// startShape brings up a bed with the given hub shape; adjust changes the
// bed's options after the matrix's defaults.
func startShape(t *testing.T, shape hubShape, adjust ...func(*testbed.Options)) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logDir := os.Getenv("ATOLL_E2E_LOG_DIR") // keep the log after the test
	if logDir == "" {
		logDir = t.TempDir()
	}
	logFile, err := os.Create(filepath.Join(logDir, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())+".log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	// atoll-cloud runs as the ServiceAccount of deploy/base/atoll-cloud.yaml,
	// and the apiserver logs every request it makes (least privilege:
	// checkLeastPrivilege).
	auditDir := t.TempDir()
	auditFlags, err := kubetest.Audit(auditDir, testbed.CloudUser)
	if err != nil {
		t.Fatal(err)
	}
	opts := testbed.Options{
		Dir:        t.TempDir(),
		Net:        shape.net,
		HubCluster: shape.cluster,
		Logger:     slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Kube: kubetest.Config{UnreachableTolerationSeconds: int(toleration.Seconds()), NotReadyTolerationSeconds: int(toleration.Seconds()),
			ExtraAPIServerFlags: auditFlags},
		ServiceAccount: true,
		Cloud:          func(c *cloudapp.Config) { c.Health.HoldTime = holdTime },
	}
	faults := newFaults(t)
	opts.Agent = faults.agents
	for _, f := range adjust {
		f(&opts)
	}
	bed, err := testbed.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("atoll log: %s\n%s", logFile.Name(), bed.Cluster.LogTails(40))
		}
		bed.Stop()
	})
	return &env{bed: bed, client: bed.Cluster.Client(), faults: faults, logPath: logFile.Name(), auditDir: auditDir}
}

// site creates a unit of n nodes with one pod per node behind a Service,
// and waits until every endpoint is ready and, with agents and n > 1,
// every other member checks the first node and the peers call it healthy.
func (e *env) site(t *testing.T, unit string, n int, agents bool) []string {
	t.Helper()
	ctx := t.Context()
	var err error
	if agents {
		_, err = e.bed.Sites.AddSite(ctx, unit, n)
	} else {
		_, err = e.bed.Sites.AddSiteWithoutAgents(ctx, unit, n)
	}
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for i := 1; i <= n; i++ {
		nodes = append(nodes, fmt.Sprintf("%s-%d", unit, i))
	}
	if err := e.bed.DeployWeb(ctx, unit, nodes); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, time.Minute, func() error {
		for _, node := range nodes {
			if ok, err := e.endpointReady(unit, "web-"+node); err != nil || !ok {
				return fmt.Errorf("endpoint of web-%s not ready yet (%v): %s", node, err, e.describe(unit, "web-"+node))
			}
		}
		if !agents || n < 2 {
			return nil // a unit of one never has a verdict: nobody else reports
		}
		// The unit is formed: about every member, every other member's
		// reports reach the voters and the peers' verdict is written (on
		// the hub cluster a server may be down meanwhile, and the agents'
		// views and reports take longer to settle). A node's report about
		// itself never counts. A scenario that cut a node whose verdict
		// was not yet written would test nothing.
		for _, node := range nodes {
			if j := e.bed.Health.Tally(node); int(j.Checkers) != n-1 {
				return fmt.Errorf("unit %s: %d of the %d other checkers report on %s", unit, j.Checkers, n-1, node)
			}
			if err := e.verdict(node, "healthy"); err != nil {
				return err
			}
		}
		return nil
	})
	return nodes
}

// partition cuts node's link to the cloud: its kubelet stops renewing its
// Lease and its agent's leaf link to the hub goes down. Its unit peers can
// still reach it.
func (e *env) partition(t *testing.T, node string) {
	t.Helper()
	if err := e.bed.Kubelet.Partition(node); err != nil {
		t.Fatal(err)
	}
	if n, _ := e.bed.Sites.Node(node); n != nil && n.Running() {
		if err := e.bed.Sites.SetLeaf(node, false); err != nil {
			t.Fatal(err)
		}
	}
}

func (e *env) heal(t *testing.T, node string) {
	t.Helper()
	if n, _ := e.bed.Sites.Node(node); n != nil && n.Running() {
		if err := e.bed.Sites.SetLeaf(node, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.bed.Kubelet.Heal(node); err != nil {
		t.Fatal(err)
	}
}

// kill stops the node entirely: agent, kubelet endpoint, Lease.
func (e *env) kill(t *testing.T, node string) {
	t.Helper()
	if err := e.bed.Sites.StopAgent(t.Context(), node); err != nil {
		t.Fatal(err)
	}
	if err := e.bed.Sites.StopKubelet(node); err != nil {
		t.Fatal(err)
	}
	if err := e.bed.Kubelet.Partition(node); err != nil {
		t.Fatal(err)
	}
}

func (e *env) node(name string) (*corev1.Node, error) {
	return e.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
}

func hasTaint(n *corev1.Node, effect corev1.TaintEffect) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeUnreachable && t.Effect == effect
	})
}

func (e *env) waitUnknown(t *testing.T, node string) time.Time {
	t.Helper()
	poll.Eventually(t, 30*time.Second, func() error {
		n, err := e.node(node)
		if err != nil {
			return err
		}
		if s := health.ReadyStatus(n); s != corev1.ConditionUnknown {
			return fmt.Errorf("%s Ready=%s", node, s)
		}
		if !hasTaint(n, corev1.TaintEffectNoSchedule) {
			return fmt.Errorf("%s has no unreachable:NoSchedule taint yet", node)
		}
		return nil
	})
	return time.Now()
}

// endpointReady reports whether pod's EndpointSlice endpoint is ready.
func (e *env) endpointReady(ns, pod string) (bool, error) {
	return e.bed.EndpointReady(context.Background(), ns, pod)
}

// endpointsAddressReady reports whether pod's address is among the ready
// addresses of the Service's Endpoints object.
func (e *env) endpointsAddressReady(ns, pod string) (bool, error) {
	ep, err := e.client.CoreV1().Endpoints(ns).Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	for _, ss := range ep.Subsets {
		for _, a := range ss.Addresses {
			if a.TargetRef != nil && a.TargetRef.Name == pod {
				return true, nil
			}
		}
	}
	return false, nil
}

// evicted reports whether the pod was deleted (or is being deleted).
func (e *env) evicted(ns, pod string) (bool, error) {
	p, err := e.client.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return p.DeletionTimestamp != nil, nil
}

func (e *env) verdict(node, want string) error {
	n, err := e.node(node)
	if err != nil {
		return err
	}
	if got := n.Annotations[wellknown.AnnotationVerdict]; got != want {
		if e.bed.Health == nil { // atoll-cloud runs in replicas
			return fmt.Errorf("%s verdict annotation %q, want %q", node, got, want)
		}
		j := e.bed.Health.Tally(node)
		return fmt.Errorf("%s verdict annotation %q, want %q (votes healthy=%d,unhealthy=%d,none=%d; freshest: normal=%d,abnormal=%d,checkers=%d)",
			node, got, want, j.Healthy, j.Unhealthy, j.Undecided, j.Normal, j.Abnormal, j.Checkers)
	}
	return nil
}

// holdsFor checks, every 250 ms for d, that check passes.
func holdsFor(t *testing.T, d time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if err := check(); err != nil {
			t.Fatalf("after %v: %v", d-time.Until(deadline), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// waitEvicted waits for pod's eviction and returns when it happened.
func (e *env) waitEvicted(t *testing.T, ns, pod string, within time.Duration) time.Time {
	t.Helper()
	poll.Eventually(t, within, func() error {
		ok, err := e.evicted(ns, pod)
		if err != nil || !ok {
			return fmt.Errorf("%s not evicted (%v)", pod, err)
		}
		return nil
	})
	return time.Now()
}

// killHub stops the hub server atoll-cloud's link is on (a cluster bed
// only) and returns a function that restarts it.
func (e *env) killHub(t *testing.T) func() {
	t.Helper()
	formed := make(chan struct{})
	go func() { e.formed.Wait(); close(formed) }()
	select {
	case <-formed:
	case <-time.After(3 * time.Minute): // a scenario failed before forming its sites
		t.Log("killing the hub server before every unit formed")
	}
	c := e.bed.HubCluster
	on := e.bed.HubLink.Conn().ConnectedServerName()
	for i := range natstest.ClusterSize {
		if h := c.Server(i); h != nil && h.Name() == on {
			if err := c.Kill(i); err != nil {
				t.Fatal(err)
			}
			t.Logf("killed hub server %s, the one atoll-cloud was connected to", on)
			return func() {
				if err := c.Restart(t.Context(), i); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	t.Fatalf("atoll-cloud is connected to no hub server (%q)", on)
	return nil
}

// TestDistributedHealth is the scenario matrix of distributed health, on
// both hub shapes. On the hub cluster, one hub server (the one atoll-cloud
// is connected to) is killed while scenario 1's node is protected, with
// every other scenario running. Then crashMatrix, on the same bed, with
// atoll-cloud in processes of its own. atoll-cloud runs as the
// ServiceAccount of deploy/base/atoll-cloud.yaml; once the scenarios are
// done, the apiserver's
// audit log must show it was refused nothing and used every permission
// the manifest grants it (checkLeastPrivilege).
func TestDistributedHealth(t *testing.T) {
	for _, shape := range []hubShape{embeddedHub, hubCluster} {
		t.Run(shape.name, func(t *testing.T) {
			// The shapes run at once, each on a bed of its own.
			t.Parallel()
			e := startShape(t, shape)
			// After the parallel scenarios, before the bed stops
			// (cleanups run last registered first).
			t.Cleanup(func() { e.checkLeastPrivilege(t) })
			t.Run("matrix", func(t *testing.T) { healthMatrix(t, e) })
			if t.Failed() {
				return
			}
			// Then atoll-cloud as deployed, in replicas of its binary:
			// one with the embedded hub (the default install), two on
			// the hub cluster.
			replicas := map[bool]int{false: 1, true: 2}[shape.cluster]
			crashMatrix(t, e, replicas)
		})
	}
}

func healthMatrix(t *testing.T, e *env) {
	e.formed.Add(7) // one per scenario below
	// 1. The node's cloud link is down but its peers see it healthy: it
	// stays Unknown with NoSchedule only, its pod is never evicted, its
	// endpoint stays ready and its verdict healthy for three tolerations;
	// healing restores it. On a hub cluster a hub server dies meanwhile.
	t.Run("cloud link down, peers healthy", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s1", 3, true)
		e.formed.Done()
		x := nodes[0]
		e.partition(t, x)
		e.waitUnknown(t, x)
		poll.Eventually(t, 10*time.Second, func() error { return e.verdict(x, "healthy") })
		transient := time.Duration(0)
		protected := func() error {
			n, err := e.node(x)
			if err != nil {
				return err
			}
			if hasTaint(n, corev1.TaintEffectNoExecute) {
				// KCM re-adds the taint each monitor period; the webhook
				// strips it on the way in. Tolerate a glimpse, never
				// a stay.
				transient += 250 * time.Millisecond
				if transient > time.Second {
					return fmt.Errorf("%s keeps the unreachable:NoExecute taint", x)
				}
			}
			if ev, err := e.evicted("s1", "web-"+x); err != nil || ev {
				return fmt.Errorf("pod web-%s evicted (%v)", x, err)
			}
			if ok, err := e.endpointReady("s1", "web-"+x); err != nil || !ok {
				return fmt.Errorf("EndpointSlice endpoint of web-%s not ready (%v)", x, err)
			}
			if ok, err := e.endpointsAddressReady("s1", "web-"+x); err != nil || !ok {
				return fmt.Errorf("Endpoints address of web-%s not ready (%v)", x, err)
			}
			return e.verdict(x, "healthy")
		}
		holdsFor(t, toleration, protected)
		if e.bed.HubCluster != nil {
			restart := e.killHub(t)
			holdsFor(t, 2*toleration, protected)
			restart()
		} else {
			holdsFor(t, 2*toleration, protected)
		}
		e.heal(t, x)
		poll.Eventually(t, 30*time.Second, func() error {
			n, err := e.node(x)
			if err != nil {
				return err
			}
			if health.ReadyStatus(n) != corev1.ConditionTrue || hasTaint(n, corev1.TaintEffectNoSchedule) {
				return fmt.Errorf("%s not back to normal: Ready=%s taints=%v", x, health.ReadyStatus(n), n.Spec.Taints)
			}
			return nil
		})
	})

	// 2. The node is really dead and its cloud link down: peers vote it
	// unhealthy and Kubernetes evicts within the toleration.
	t.Run("node dead", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s2", 3, true)
		e.formed.Done()
		x := nodes[0]
		e.kill(t, x)
		poll.Eventually(t, 20*time.Second, func() error { return e.verdict(x, "unhealthy") })
		lost := e.waitUnknown(t, x)
		evicted := e.waitEvicted(t, "s2", "web-"+x, toleration+15*time.Second)
		t.Logf("evicted %v after the node was lost (toleration %v)", evicted.Sub(lost).Round(100*time.Millisecond), toleration)
		poll.Eventually(t, 10*time.Second, func() error {
			if ok, _ := e.endpointReady("s2", "web-"+x); ok {
				return fmt.Errorf("endpoint of the dead node's pod still ready")
			}
			return nil
		})
	})

	// 3. Control: the same cut as 1 on a site without Atoll agents: the
	// pod is evicted. This is what 1 prevents.
	t.Run("control without atoll", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s3", 3, false)
		e.formed.Done()
		x := nodes[0]
		e.partition(t, x)
		lost := e.waitUnknown(t, x)
		evicted := e.waitEvicted(t, "s3", "web-"+x, toleration+15*time.Second)
		t.Logf("without Atoll: evicted %v after the node was lost", evicted.Sub(lost).Round(100*time.Millisecond))
	})

	// 4. The whole unit is cut from the cloud: its pods are held for the
	// hold time, then released to Kubernetes.
	t.Run("whole unit cut", func(t *testing.T) {
		t.Parallel()
		// A healthy zone elsewhere: when every zone is down, KCM assumes
		// its own network failed and evicts nothing at all. Alone in its
		// unit, its node never has a verdict; nothing here needs one.
		e.site(t, "s4w", 1, true)
		nodes := e.site(t, "s4", 3, true)
		e.formed.Done()
		for _, n := range nodes {
			e.partition(t, n)
		}
		for _, n := range nodes {
			e.waitUnknown(t, n)
		}
		// The unit's voters' leaf links are cut: the hub reports it and
		// their ballots stop counting.
		var since time.Time
		poll.Eventually(t, 45*time.Second, func() error {
			st, hold := e.bed.Health.UnitState("s4")
			if st != health.FullDisruption || hold.IsZero() {
				return fmt.Errorf("unit s4 is %s", st)
			}
			since = hold.Add(-holdTime)
			return nil
		})
		// Held: nothing evicted until the hold ends (minus a margin for
		// the check itself).
		holdsFor(t, time.Until(since.Add(holdTime-2*time.Second)), func() error {
			for _, n := range nodes {
				if ev, err := e.evicted("s4", "web-"+n); err != nil || ev {
					return fmt.Errorf("web-%s evicted during the hold (%v)", n, err)
				}
			}
			return nil
		})
		for _, n := range nodes {
			e.waitEvicted(t, "s4", "web-"+n, toleration+20*time.Second)
		}
		t.Logf("released %v after the hold began", time.Since(since).Round(time.Second))
	})

	// 5. A split vote gives no verdict and no Atoll patch: Kubernetes
	// evicts the lost node's pod. Five nodes split three against two, the
	// node in the group of three: two of its four others say normal, two
	// abnormal (its own report does not count).
	t.Run("split vote", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s5", 5, true)
		e.formed.Done()
		for _, a := range nodes[:3] {
			for _, b := range nodes[3:] {
				e.faults.block(a, b)
			}
		}
		x := nodes[0]
		poll.Eventually(t, 20*time.Second, func() error {
			if j := e.bed.Health.Tally(x); j.Normal != 2 || j.Abnormal != 2 {
				return fmt.Errorf("freshest vote on %s: normal=%d abnormal=%d, want 2 against 2", x, j.Normal, j.Abnormal)
			}
			return e.verdict(x, "none")
		})
		e.partition(t, x)
		e.waitUnknown(t, x)
		e.waitEvicted(t, "s5", "web-"+x, toleration+15*time.Second)
		if err := e.verdict(x, "none"); err != nil {
			t.Fatal(err)
		}
	})

	// 6. A checker that stops publishing stops counting once its reports
	// are older than the timeout; with fewer fresh others than more than
	// half of them, there is no verdict.
	t.Run("stale reports", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s6", 4, true)
		e.formed.Done()
		// The freshest vote's counts, as atoll-cloud reads them (`atoll
		// status` shows the same).
		votes := func(node string) string {
			j := e.bed.Health.Tally(node)
			return fmt.Sprintf("normal=%d,abnormal=%d,checkers=%d", j.Normal, j.Abnormal, j.Checkers)
		}
		poll.Eventually(t, 20*time.Second, func() error {
			if v := votes(nodes[0]); v != "normal=3,abnormal=0,checkers=3" {
				return fmt.Errorf("votes %q, want its three others", v)
			}
			return nil
		})
		// The fourth node's agent stops (its kubelet keeps answering):
		// two of three others are still fresh, more than half.
		if err := e.bed.Sites.StopAgent(t.Context(), nodes[3]); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 30*time.Second, func() error {
			if v := votes(nodes[0]); v != "normal=2,abnormal=0,checkers=2" {
				return fmt.Errorf("votes %q, want two fresh checkers", v)
			}
			return e.verdict(nodes[0], "healthy")
		})
		// The third one's stops too: one of three is too few.
		if err := e.bed.Sites.StopAgent(t.Context(), nodes[2]); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 45*time.Second, func() error {
			if v := votes(nodes[0]); v != "normal=1,abnormal=0,checkers=1" {
				return fmt.Errorf("votes %q, want one fresh checker", v)
			}
			return e.verdict(nodes[0], "none")
		})
	})

	// 7. Every agent of a unit stops (a bad agent rollout) while its
	// kubelets keep reporting: the unit is AgentsSilent, never held (no
	// hold annotation on any node, at any poll); then one kubelet really
	// dies: its pod is evicted within the toleration, as without Atoll,
	// and the others' pods stay.
	t.Run("agents down, kubelets report", func(t *testing.T) {
		t.Parallel()
		nodes := e.site(t, "s7", 3, true)
		e.formed.Done()
		for _, n := range nodes {
			if err := e.bed.Sites.StopAgent(t.Context(), n); err != nil {
				t.Fatal(err)
			}
		}
		notHeld := func() error {
			if st, _ := e.bed.Health.UnitState("s7"); st == health.FullDisruption {
				return fmt.Errorf("unit s7 is held though its kubelets report")
			}
			for _, n := range nodes {
				nn, err := e.node(n)
				if err != nil {
					return err
				}
				if until, ok := nn.Annotations[wellknown.AnnotationHoldUntil]; ok {
					return fmt.Errorf("%s carries a hold until %s", n, until)
				}
			}
			return nil
		}
		// Past SilentAfter (30 s), the agents count as silent.
		holdsFor(t, 35*time.Second, notHeld)
		poll.Eventually(t, 15*time.Second, func() error {
			if st, _ := e.bed.Health.UnitState("s7"); st != health.AgentsSilent {
				return fmt.Errorf("unit s7 is %s, want %s", st, health.AgentsSilent)
			}
			return notHeld()
		})
		x := nodes[0]
		if err := e.bed.Sites.StopKubelet(x); err != nil {
			t.Fatal(err)
		}
		if err := e.bed.Kubelet.Partition(x); err != nil {
			t.Fatal(err)
		}
		lost := e.waitUnknown(t, x)
		evicted := e.waitEvicted(t, "s7", "web-"+x, toleration+15*time.Second)
		t.Logf("agents silent, kubelet dead: evicted %v after the node was lost (toleration %v)", evicted.Sub(lost).Round(100*time.Millisecond), toleration)
		if err := notHeld(); err != nil {
			t.Error(err)
		}
		for _, n := range nodes[1:] {
			if ev, err := e.evicted("s7", "web-"+n); err != nil || ev {
				t.Errorf("web-%s evicted (%v): its kubelet reports", n, err)
			}
		}
	})
}

// describe summarises a pod and its Service's slices, for failures.
func (e *env) describe(ns, pod string) string {
	var b strings.Builder
	p, err := e.client.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(&b, "pod: %v; ", err)
	} else {
		fmt.Fprintf(&b, "pod phase=%s ip=%s conditions=", p.Status.Phase, p.Status.PodIP)
		for _, c := range p.Status.Conditions {
			fmt.Fprintf(&b, "%s=%s,", c.Type, c.Status)
		}
		b.WriteString("; ")
	}
	list, err := e.client.DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(&b, "slices: %v", err)
		return b.String()
	}
	for _, s := range list.Items {
		fmt.Fprintf(&b, "slice %s:", s.Name)
		for _, ep := range s.Endpoints {
			name := ""
			if ep.TargetRef != nil {
				name = ep.TargetRef.Name
			}
			fmt.Fprintf(&b, " %s ready=%v", name, ep.Conditions.Ready != nil && *ep.Conditions.Ready)
		}
		b.WriteString("; ")
	}
	return b.String()
}
