package health_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// peersHealthy is voter's verdicts in a unit of names: every other member
// healthy.
func peersHealthy(names []string, voter string) map[string]atollv1.Verdict {
	verdicts := map[string]atollv1.Verdict{}
	for _, n := range names {
		if n != voter {
			verdicts[n] = atollv1.Verdict_VERDICT_HEALTHY
		}
	}
	return verdicts
}

// publishBallot publishes voter's ballot for unit, made at at, to the
// HEALTH stream: its verdicts by node, sorted by node as voters send them.
func publishBallot(t *testing.T, ctx context.Context, js jetstream.JetStream, unit, voter string, at time.Time, ttl time.Duration, verdicts map[string]atollv1.Verdict) {
	t.Helper()
	b := &atollv1.Ballot{Voter: voter, Unit: unit, Time: timestamppb.New(at), Ttl: durationpb.New(ttl), Members: uint32(len(verdicts) + 1)}
	for _, node := range slices.Sorted(maps.Keys(verdicts)) {
		b.Votes = append(b.Votes, &atollv1.Vote{Node: node, Verdict: verdicts[node], Normal: 1, Since: timestamppb.New(at)})
	}
	subj, err := events.BallotSubject(unit, voter)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.PublishDurable(ctx, js, subj, b, ""); err != nil {
		t.Fatal(err)
	}
}

// TestReconcilerOneWritePerObject runs the service on a manager against a
// real kube-apiserver (with its audit log) and a real hub. A lost node
// with the unreachable taints and a not-ready endpoint gets one healthy
// vote: one verdict. The apiserver must then have taken exactly one
// write from atoll-cloud per object: the Node (annotations and taint in
// one patch), the EndpointSlice and the Endpoints. With two replicas
// electing a leader the count is the same, and both replicas know the
// node is protected: the webhook may ask either.
func TestReconcilerOneWritePerObject(t *testing.T) {
	t.Run("one replica", func(t *testing.T) { testOneWritePerObject(t, 1, false) })
	t.Run("two replicas with leader election", func(t *testing.T) { testOneWritePerObject(t, 2, false) })
	// The leader stops before the vote: the other replica takes the Lease
	// and the durable consumer, and applies the verdict.
	t.Run("two replicas, leader fails over", func(t *testing.T) { testOneWritePerObject(t, 2, true) })
}

func testOneWritePerObject(t *testing.T, replicas int, failover bool) {
	auditDir := t.TempDir()
	flags, err := kubetest.Audit(auditDir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	env := startEnv(t, ctx, kubetest.WithAPIServerFlags(flags...))
	cluster, rc, client, nc, js := env.cluster, env.rc, env.client, env.nc, env.js
	log := natstest.Logger(t, slog.LevelWarn)

	const node, ns = "edge-1", "shop"
	addNode(t, ctx, client, node, corev1.ConditionUnknown)
	// A peer the cloud still hears keeps the unit PartialDisruption
	// throughout: the verdict is the only change.
	addNode(t, ctx, client, "edge-2", corev1.ConditionTrue)
	if err := cluster.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	notReady := discoveryv1.EndpointConditions{Ready: ptr.To(false), Serving: ptr.To(false), Terminating: ptr.To(false)}
	if _, err := client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.1"}, NodeName: ptr.To(node), Conditions: notReady}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Endpoints(ns).Create(ctx, &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Subsets: []corev1.EndpointSubset{{
			NotReadyAddresses: []corev1.EndpointAddress{{IP: "10.1.0.1", NodeName: ptr.To(node)}},
			Ports:             []corev1.EndpointPort{{Port: 80, Protocol: corev1.ProtocolTCP}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var services []*replica
	for i := range replicas {
		// Each replica has its own user agent, so the audit log tells
		// which one wrote.
		rrc := rest.CopyConfig(rc)
		rrc.UserAgent = fmt.Sprintf("replica-%d", i)
		services = append(services, startReplica(t, ctx, rrc, hublink.Of(nc, js), log.With("replica", i), replicas > 1))
		services[i].name = rrc.UserAgent
	}
	for _, r := range services {
		poll.Eventually(t, 20*time.Second, func() error { return r.s.Ready(ctx) }) // empty stream
	}
	// Before any vote the reconciler annotates the lost node once.
	poll.Eventually(t, 20*time.Second, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v := n.Annotations[wellknown.AnnotationVerdict]; v != "none" {
			return fmt.Errorf("verdict annotation %q", v)
		}
		return nil
	})
	before := settledWrites(t, auditDir)
	writer := "replica-0"
	if failover {
		// Stop whichever replica leads; the other must take over.
		var leader int
		poll.Eventually(t, 20*time.Second, func() error {
			for i, r := range services {
				select {
				case <-r.m.Elected():
					leader = i
					return nil
				default:
				}
			}
			return fmt.Errorf("no leader")
		})
		services[leader].stop()
		services = slices.Delete(services, leader, leader+1)
		writer = services[0].name
	}

	publishBallot(t, ctx, js, "u1", "edge-2", time.Now(), time.Minute, map[string]atollv1.Verdict{node: atollv1.Verdict_VERDICT_HEALTHY})

	poll.Eventually(t, 30*time.Second, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v := n.Annotations[wellknown.AnnotationVerdict]; v != "healthy" {
			return fmt.Errorf("verdict annotation %q", v)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Effect == corev1.TaintEffectNoExecute }) {
			return fmt.Errorf("taints %v", n.Spec.Taints)
		}
		sl, err := client.DiscoveryV1().EndpointSlices(ns).Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c := sl.Endpoints[0].Conditions; c.Ready == nil || !*c.Ready {
			return fmt.Errorf("slice endpoint not ready")
		}
		ep, err := client.CoreV1().Endpoints(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(ep.Subsets) == 0 || len(ep.Subsets[0].Addresses) != 1 {
			return fmt.Errorf("endpoints address not ready: %+v", ep.Subsets)
		}
		return nil
	})
	after := settledWrites(t, auditDir)
	for _, r := range services {
		if !r.s.Protected(node) {
			t.Errorf("%s does not protect %s", r.name, node)
		}
	}
	// Only the leader writes: all of the verdict's writes come from one
	// replica (after a fail-over, the survivor).
	audit, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
	if err != nil {
		t.Fatal(err)
	}
	writers := map[string]int{}
	for _, e := range audit {
		if e.FieldManager() == wellknown.FieldManager {
			writers[e.UserAgent]++
		}
	}
	switch {
	case !failover && len(writers) != 1:
		t.Errorf("atoll-cloud writes by replica: %v, want all from one", writers)
	case failover && writers[writer] < 3: // the node, the slice, the Endpoints
		t.Errorf("atoll-cloud writes by replica: %v, want the verdict's from %s", writers, writer)
	}
	want := map[string]int{"nodes//" + node: 1, "endpointslices/" + ns + "/web-1": 1, "endpoints/" + ns + "/web": 1}
	for obj := range after {
		if _, ok := want[obj]; !ok {
			want[obj] = 0
		}
	}
	for obj, n := range want {
		if got := after[obj] - before[obj]; got != n {
			t.Errorf("%s: %d writes by %s for one verdict, want %d", obj, got, wellknown.FieldManager, n)
		}
	}
	if t.Failed() {
		events, _ := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		var b strings.Builder
		for _, e := range events {
			fmt.Fprintf(&b, "%s %s %d %s\n", e.Verb, e.Object(), e.ResponseStatus.Code, e.RequestURI)
		}
		t.Logf("audit:\n%s", b.String())
	}
}

// testEnv is a real kube-apiserver and a real hub with Atoll's streams.
type testEnv struct {
	cluster *kubetest.Cluster
	rc      *rest.Config
	client  kubernetes.Interface
	nc      *nats.Conn
	js      jetstream.JetStream
}

func startEnv(t *testing.T, ctx context.Context, opts ...kubetest.Option) testEnv {
	t.Helper()
	cluster := kubetest.Start(t, opts...)
	rc, client := cluster.RESTConfig(), cluster.Client()
	h := natstest.Hub(t)
	nc, err := h.Connect("health-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	return testEnv{cluster: cluster, rc: rc, client: client, nc: nc, js: js}
}

// replica is one atoll-cloud replica's health service on its own manager.
type replica struct {
	name string
	s    *health.Service
	m    *manager.Manager
	stop func()
}

// startReplica runs a replica until the test ends or stop.
func startReplica(t *testing.T, ctx context.Context, rc *rest.Config, b *hublink.Link, log *slog.Logger, elect bool) *replica {
	t.Helper()
	return startReplicaWith(t, ctx, rc, b, log, elect, nil)
}

// startReplicaWith is startReplica with the health config changed by mutate.
func startReplicaWith(t *testing.T, ctx context.Context, rc *rest.Config, b *hublink.Link, log *slog.Logger, elect bool, mutate func(*health.Config)) *replica {
	t.Helper()
	mcfg := manager.DefaultConfig()
	mcfg.LeaderElect = elect
	mcfg.LeaderElectionNamespace = "kube-system"
	mcfg.LeaseDuration, mcfg.RenewDeadline, mcfg.RetryPeriod = 4*time.Second, 2*time.Second, 200*time.Millisecond
	m, err := manager.New(mcfg, rc, log)
	if err != nil {
		t.Fatal(err)
	}
	cfg := health.DefaultConfig()
	cfg.Resync = 200 * time.Millisecond // many resyncs: none may write again
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := health.New(cfg, b, m, log, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(ctx); err == nil {
		t.Fatal("ready before following the votes")
	}
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(runCtx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
			_ = m.Stop(context.Background())
		})
	}
	t.Cleanup(stop)
	return &replica{s: s, m: m, stop: stop}
}

// settledWrites waits until the service has resynced (every 200ms) for
// two seconds without a new write, and returns atoll-cloud's writes by
// object: a reconcile of objects already right must not write.
func settledWrites(t *testing.T, auditDir string) map[string]int {
	t.Helper()
	return quietWrites(t, auditDir, 2*time.Second, 30*time.Second)
}

// quietWrites waits, at most within, until atoll-cloud has written
// nothing for quiet, and returns its writes by object.
func quietWrites(t *testing.T, auditDir string, quiet, within time.Duration) map[string]int {
	t.Helper()
	var last map[string]int
	stable := time.Time{}
	poll.Eventually(t, within, func() error {
		events, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		if err != nil {
			return err
		}
		w := kubetest.Writes(events, wellknown.FieldManager)
		if !maps.Equal(w, last) {
			last, stable = w, time.Now()
		}
		if time.Since(stable) < quiet {
			return fmt.Errorf("writes still changing: %v", w)
		}
		return nil
	})
	return last
}

// addNode creates a node of unit u1 with the given Ready status; a lost
// one (Unknown) carries both unreachable taints, as the node lifecycle
// controller leaves it.
func addNode(t *testing.T, ctx context.Context, client kubernetes.Interface, name string, ready corev1.ConditionStatus) {
	t.Helper()
	addNodeReason(t, ctx, client, name, ready, protect.ReasonNodeStatusUnknown)
}

// addNodeReason is addNode with the Ready condition's reason.
func addNodeReason(t *testing.T, ctx context.Context, client kubernetes.Interface, name string, ready corev1.ConditionStatus, reason string) {
	t.Helper()
	addUnitNode(t, ctx, client, "u1", name, ready, reason)
}

// addUnitNode is addNodeReason in unit.
func addUnitNode(t *testing.T, ctx context.Context, client kubernetes.Interface, unit, name string, ready corev1.ConditionStatus, reason string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{wellknown.LabelUnit: unit}}}
	if ready == corev1.ConditionUnknown {
		node.Spec.Taints = []corev1.Taint{
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
			{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
		}
	}
	n, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready,
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: reason}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
