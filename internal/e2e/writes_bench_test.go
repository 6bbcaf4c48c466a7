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
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/internal/testenv/kubetest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
	"github.com/atoll-edge/atoll/internal/testenv/testbed"
	"github.com/atoll-edge/atoll/internal/wellknown"
)

// BenchmarkWrites counts atoll-cloud's writes to the apiserver (its field
// manager, in the audit log) in three phases of ATOLL_BENCH_PHASE each
// (default 5m) on a bed of two units of three real agents:
//
//   - steady: nothing changes;
//   - cloud link flapping: one node's cloud link goes down and up every
//     15 s (longer than KCM's grace period, so each flap is a real Ready
//     change, and atoll-cloud protects the node each time);
//   - peer link flapping: that node's peers lose and regain it every 15 s
//     (each flap a real verdict change).
//
// It reports writes per minute in each phase and, while flapping, writes
// per real change (Ready transitions, verdict changes). Run it with
// `go tool task bench:writes` (one iteration: -benchtime 1x).
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
	bed, err := testbed.Start(ctx, testbed.Options{
		Dir:    filepath.Join(dir, "bed"),
		Net:    4,
		Logger: slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// Nothing is evicted during the run.
		Kube: kubetest.Config{UnreachableTolerationSeconds: 3600, NotReadyTolerationSeconds: 3600, ExtraAPIServerFlags: flags},
		Cloud: func(c *cloudapp.Config) {
			c.Health.HoldTime = time.Hour
		},
		Agent: func(c *edgeapp.Config) {
			c.Prober.Plugins = append(c.Prober.Plugins, prober.PluginConfig{
				Kind: "fault", Name: "in-unit-network", Weight: 1, Timeout: 500 * time.Millisecond,
				Args: map[string]string{"checker": c.NATS.NodeName},
			})
			c.Prober.Scoreline = 200
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(bed.Stop)
	e := &env{bed: bed, client: bed.Cluster.Client()}
	inUnit.reset()
	var calm, flapping []string
	for _, s := range []struct {
		unit  string
		nodes *[]string
	}{{"calm", &calm}, {"flap", &flapping}} {
		*s.nodes = benchSite(b, e, s.unit, 3)
	}
	x := flapping[0]

	writes := func() int {
		events, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for _, v := range kubetest.Writes(events, wellknown.FieldManager) {
			n += v
		}
		return n
	}
	// watch runs f for d while sampling x's Ready status and verdict
	// annotation every 200 ms; it returns atoll-cloud's writes and the
	// changes seen.
	watch := func(d time.Duration, f func(stop <-chan struct{})) (w, readyChanges, verdictChanges int) {
		before := writes()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { defer close(done); f(stop) }()
		var ready corev1.ConditionStatus
		verdict := ""
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if n, err := e.node(x); err == nil {
				if r := health.ReadyStatus(n); ready != "" && r != ready {
					readyChanges++
				}
				ready = health.ReadyStatus(n)
				if v := n.Annotations[wellknown.AnnotationVerdict]; verdict != "" && v != verdict {
					verdictChanges++
					verdict = v
				} else if verdict == "" {
					verdict = v
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		close(stop)
		<-done
		return writes() - before, readyChanges, verdictChanges
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
		last, since := writes(), time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := poll.Until(ctx, func(context.Context) error {
			if w := writes(); w != last {
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
	steady, _, _ := watch(phase, func(<-chan struct{}) {})
	b.ReportMetric(perMin(steady), "steady-writes/min")

	cloudFlap, readyChanges, _ := watch(phase, func(stop <-chan struct{}) {
		every(stop, func() { benchDo(b, e.bed.Kubelet.Partition(x), e.bed.Sites.SetLeaf(x, false)) },
			func() { benchDo(b, e.bed.Sites.SetLeaf(x, true), e.bed.Kubelet.Heal(x)) })
	})
	b.ReportMetric(perMin(cloudFlap), "cloudflap-writes/min")
	b.ReportMetric(float64(readyChanges), "cloudflap-ready-changes")
	if readyChanges > 0 {
		b.ReportMetric(float64(cloudFlap)/float64(readyChanges), "cloudflap-writes/change")
	}
	settle()

	peerFlap, _, verdictChanges := watch(phase, func(stop <-chan struct{}) {
		every(stop, func() {
			for _, p := range flapping[1:] {
				inUnit.block(x, p)
			}
		}, func() {
			for _, p := range flapping[1:] {
				inUnit.unblock(x, p)
			}
		})
	})
	b.ReportMetric(perMin(peerFlap), "peerflap-writes/min")
	b.ReportMetric(float64(verdictChanges), "peerflap-verdict-changes")
	if verdictChanges > 0 {
		b.ReportMetric(float64(peerFlap)/float64(verdictChanges), "peerflap-writes/change")
	}
	b.Logf("phase %s: steady %d writes; cloud link flapping %d writes for %d Ready changes; peer link flapping %d writes for %d verdict changes",
		phase, steady, cloudFlap, readyChanges, peerFlap, verdictChanges)
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
