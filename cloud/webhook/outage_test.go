package webhook

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestOutageKeepsProtectedNode stops the webhook (every atoll-cloud replica
// down) while a protected node is cut from the cloud, for twice the pods'
// toleration, with the real node lifecycle and taint-eviction controllers
// running. The guard webhook fails closed on the controller's eviction taint
// for that node only: its pods stay. Meanwhile writes unrelated to
// protection go through: another node loses its heartbeat and its pod is
// evicted as usual, an operator labels the protected node. When atoll-cloud
// returns judging the node really dead, its pod is evicted within the
// toleration + 15 s.
func TestOutageKeepsProtectedNode(t *testing.T) {
	const toleration = 5 // seconds, unreachable and not-ready
	cluster := kubetest.Start(t, kubetest.WithControllerManager(), kubetest.WithTolerationSeconds(toleration, toleration))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	client := cluster.Client()
	const (
		protected, lost, healthy = "edge-0", "edge-1", "edge-2"
		ns                       = "shop"
	)
	certDir := t.TempDir()
	if err := cluster.WriteServingCert(certDir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	start := func(addr string, p nodeSet) *Server {
		srv, err := New(Config{Addr: addr, CertDir: certDir}, p, testLogger(t), prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = srv.Stop(context.Background()) })
		return srv
	}
	srv := start("127.0.0.1:0", protecting(protected))
	listen := srv.Addr()
	if err := Register(ctx, client, RegistrationConfig{URL: "https://" + listen + DefaultPath, CABundle: cluster.CABundle()}); err != nil {
		t.Fatal(err)
	}
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	waitEffective(t, ctx, client, ns, protected)

	sim := simulate(t, ctx, cluster, protected, lost, healthy)
	// What atoll-cloud writes on a node whose peers see it healthy.
	annotate := func(node, verdict string) {
		t.Helper()
		patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, wellknown.AnnotationVerdict, verdict)
		if _, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate(protected, wellknown.VerdictHealthy)
	for _, n := range []string{protected, lost, healthy} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-" + n, Namespace: ns},
			Spec:       corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "app", Image: "registry.example/web:1"}}},
		}
		if _, err := client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	node := func(name string) *corev1.Node {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	evicted := func(pod string) bool {
		t.Helper()
		p, err := client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return true // deleted
		}
		return p.DeletionTimestamp != nil
	}

	// The protected node is cut; with atoll-cloud up, it keeps NoSchedule
	// only.
	if err := sim.Partition(protected); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "protected node unreachable, NoSchedule only", func(ctx context.Context) error {
		n := node(protected)
		if nodeCondition(n) != corev1.ConditionUnknown || !hasTaint(n, unreachableNoSchedule) || hasTaint(n, unreachableNoExecute) {
			return fmt.Errorf("Ready=%s taints %v", nodeCondition(n), n.Spec.Taints)
		}
		return nil
	})

	// Every atoll-cloud replica goes down.
	if err := srv.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := sim.Partition(lost); err != nil {
		t.Fatal(err)
	}
	// Writes unrelated to protection still go through: an operator's
	// label on the protected node, and (below) the controller's taint and
	// eviction on the other lost node.
	if _, err := client.CoreV1().Nodes().Patch(ctx, protected, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"example.com/rack":"r1"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label a protected node while atoll-cloud is down: %v", err)
	}
	lostEvicted := false
	for time.Since(down) < 2*toleration*time.Second {
		if hasTaint(node(protected), unreachableNoExecute) {
			t.Fatalf("protected node tainted unreachable:NoExecute %s into the outage", time.Since(down).Round(100*time.Millisecond))
		}
		if evicted("web-" + protected) {
			t.Fatalf("protected pod evicted %s into the outage", time.Since(down).Round(100*time.Millisecond))
		}
		lostEvicted = lostEvicted || evicted("web-"+lost)
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	step(t, ctx, "unprotected node's pod evicted during the outage", func(ctx context.Context) error {
		if !lostEvicted && !evicted("web-"+lost) {
			return errors.New("web-" + lost + " not evicted")
		}
		return nil
	})
	t.Logf("outage of %s: protected pod kept, unprotected pod evicted", time.Since(down).Round(100*time.Millisecond))

	// atoll-cloud returns and the peers now say the node is dead.
	annotate(protected, wellknown.VerdictUnhealthy)
	start(listen, protecting())
	back := time.Now()
	step(t, ctx, "dead node's pod evicted after atoll-cloud returns", func(ctx context.Context) error {
		if !evicted("web-" + protected) {
			return errors.New("not evicted yet")
		}
		return nil
	})
	if took := time.Since(back); took > toleration*time.Second+15*time.Second {
		t.Errorf("dead node's pod evicted %s after atoll-cloud returned, want within toleration + 15s", took.Round(100*time.Millisecond))
	}
}
