package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// BenchmarkWrites counts atoll-cloud's writes to the apiserver (its field
// manager, in the audit log) in three phases of ATOLL_BENCH_PHASE each
// (default 5m) on a bed of two units of three real agents:
//
//   - steady: nothing changes;
//   - cloud link flapping: one node's cloud link goes down and up every
//     15 s (longer than KCM's grace period, so each flap is a real Ready
//     change, and atoll-cloud protects the node each time);
//   - peer link flapping: that node and its peers lose and regain each
//     other every 15 s (each flap real verdict changes in the unit).
//
// It reports writes per minute in each phase and, while flapping, writes
// per real change: per Ready transition of the node, and Node writes per
// verdict change in its unit. Run it with `go tool task bench:writes` (one
// iteration: -benchtime 1x).
func BenchmarkWrites(b *testing.B) {
	phase := 5 * time.Minute
	if v := os.Getenv("ATOLL_BENCH_PHASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("ATOLL_BENCH_PHASE: %v", err)
		}
		phase = d
	}
	const flap = 15 * time.Second
	dir := b.TempDir()
	auditDir := filepath.Join(dir, "audit")
	flags, err := kubetest.Audit(auditDir)
	if err != nil {
		b.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "atoll.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = logFile.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	faults := newFaults(b)
	bed, err := testbed.Start(ctx, testbed.Options{
		Dir:    filepath.Join(dir, "bed"),
		Net:    4,
		Logger: slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// Nothing is evicted during the run.
		Kube: kubetest.Config{UnreachableTolerationSeconds: 3600, NotReadyTolerationSeconds: 3600, ExtraAPIServerFlags: flags},
		Cloud: func(c *cloudapp.Config) {
			c.Health.HoldTime = time.Hour
		},
		Agent: faults.agents,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(bed.Stop)
	e := &env{bed: bed, client: bed.Cluster.Client(), faults: faults}
	var calm, flapping []string
	for _, s := range []struct {
		unit  string
		nodes *[]string
	}{{"calm", &calm}, {"flap", &flapping}} {
		*s.nodes = benchSite(b, e, s.unit, 3)
	}
	x := flapping[0]

	// writes counts atoll-cloud's writes by resource (nodes, endpoints,
	// endpointslices).
	writes := func() map[string]int {
		events, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		if err != nil {
			b.Fatal(err)
		}
		out := map[string]int{}
		for obj, n := range kubetest.Writes(events, wellknown.FieldManager) {
			out[strings.SplitN(obj, "/", 2)[0]] += n
		}
		return out
	}
	sum := func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	}
	// changes is what really changed in a phase: Ready transitions of x,
	// and verdict changes of every node of its unit (x's peers lose x
	// too, so their own verdicts move when x's link to them flaps).
	type changes struct{ ready, verdicts int }
	// watch runs f for d while sampling the flapping unit's nodes every
	// 200 ms; it returns atoll-cloud's writes by resource and the changes
	// seen.
	watch := func(d time.Duration, f func(stop <-chan struct{})) (map[string]int, changes) {
		before := writes()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { defer close(done); f(stop) }()
		var c changes
		ready := map[string]corev1.ConditionStatus{}
		verdict := map[string]string{}
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			for _, name := range flapping {
				n, err := e.node(name)
				if err != nil {
					continue
				}
				r, v := health.ReadyStatus(n), n.Annotations[wellknown.AnnotationVerdict]
				if old, ok := ready[name]; ok && old != r && name == x {
					c.ready++
				}
				if old, ok := verdict[name]; ok && old != v {
					c.verdicts++
				}
				ready[name], verdict[name] = r, v
			}
			time.Sleep(200 * time.Millisecond)
		}
		close(stop)
		<-done
		after := writes()
		for k := range after {
			after[k] -= before[k]
		}
		return after, c
	}
	every := func(stop <-chan struct{}, down, up func()) {
		for {
			down()
			select {
			case <-stop:
				up()
				return
			case <-time.After(flap):
			}
			up()
			select {
			case <-stop:
				return
			case <-time.After(flap):
			}
		}
	}
	settle := func() {
		last, since := sum(writes()), time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := poll.Until(ctx, func(context.Context) error {
			if w := sum(writes()); w != last {
				last, since = w, time.Now()
			}
			if time.Since(since) < 5*time.Second {
				return fmt.Errorf("atoll-cloud still writing")
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	perMin := func(n int) float64 { return float64(n) / phase.Minutes() }

	b.ResetTimer()
	settle()
	steady, _ := watch(phase, func(<-chan struct{}) {})
	b.ReportMetric(perMin(sum(steady)), "steady-writes/min")

	cloudFlap, cc := watch(phase, func(stop <-chan struct{}) {
		every(stop, func() { benchDo(b, e.bed.Kubelet.Partition(x), e.bed.Sites.SetLeaf(x, false)) },
			func() { benchDo(b, e.bed.Sites.SetLeaf(x, true), e.bed.Kubelet.Heal(x)) })
	})
	b.ReportMetric(perMin(sum(cloudFlap)), "cloudflap-writes/min")
	if cc.ready > 0 {
		// Each loss (half the Ready changes) needs x's Endpoints and
		// EndpointSlice kept ready.
		b.ReportMetric(float64(sum(cloudFlap))/float64(cc.ready), "cloudflap-writes/ready-change")
	}
	settle()

	peerFlap, pc := watch(phase, func(stop <-chan struct{}) {
		every(stop, func() {
			for _, p := range flapping[1:] {
				e.faults.block(x, p)
			}
		}, func() {
			for _, p := range flapping[1:] {
				e.faults.unblock(x, p)
			}
		})
	})
	b.ReportMetric(perMin(sum(peerFlap)), "peerflap-writes/min")
	if pc.verdicts > 0 {
		b.ReportMetric(float64(peerFlap["nodes"])/float64(pc.verdicts), "peerflap-node-writes/verdict-change")
	}
	b.Logf("phases of %s. steady: writes %v. cloud link flapping every %s: writes %v for %d Ready changes of %s and %d verdict changes in its unit. peer link flapping every %s: writes %v for %d verdict changes in its unit",
		phase, steady, flap, cloudFlap, cc.ready, x, cc.verdicts, flap, peerFlap, pc.verdicts)
	if b.Failed() {
		b.Logf("atoll log: %s\n%s", logFile.Name(), bed.Cluster.LogTails(40))
	}
}

// benchSite is env.site for a benchmark: a unit of n agents with one web
// pod each, formed and healthy.
func benchSite(b *testing.B, e *env, unit string, n int) []string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := e.bed.Sites.AddSite(ctx, unit, n); err != nil {
		b.Fatal(err)
	}
	var nodes []string
	for i := 1; i <= n; i++ {
		nodes = append(nodes, fmt.Sprintf("%s-%d", unit, i))
	}
	if err := e.bed.DeployWeb(ctx, unit, nodes); err != nil {
		b.Fatal(err)
	}
	err := poll.Until(ctx, func(context.Context) error {
		for _, node := range nodes {
			if ok, err := e.endpointReady(unit, "web-"+node); err != nil || !ok {
				return fmt.Errorf("endpoint of web-%s not ready (%v)", node, err)
			}
			if err := e.verdict(node, wellknown.VerdictHealthy); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return nodes
}

func benchDo(b *testing.B, errs ...error) {
	for _, err := range errs {
		if err != nil && !strings.Contains(err.Error(), "already") {
			b.Error(err)
		}
	}
}
