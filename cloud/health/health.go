// Package health is the cloud half of distributed health. It follows the
// votes of every edge unit and, for a node that kube-controller-manager
// marked Ready=Unknown (the cloud lost it), applies the peers' verdict:
//
//   - peers say healthy: annotate the node, remove the
//     node.kubernetes.io/unreachable:NoExecute taint (keep NoSchedule), and
//     keep its pods' endpoints ready in EndpointSlices and Endpoints;
//   - peers say unhealthy (or nothing): annotate; Kubernetes evicts.
//
// When a whole unit falls silent (every node Unknown, no fresh vote) its
// pods are held for HoldTime before Kubernetes may proceed. The mutating
// webhook (cloud/webhook) applies the same decision on every write, through
// Service.Protected, because the node lifecycle and endpoint controllers
// keep re-applying their own view.
//
// Votes arrive twice: every replica follows all of them to know the whole
// state (the webhook may be asked on any replica), and one replica handles
// each vote through a shared durable consumer, acking after its patches.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// HoldBucket is the KV bucket recording since when each unit is fully
// disrupted, so every replica (and a restarted one) holds it equally long.
const HoldBucket = "atoll_unit_holds"

const byNodeIndex = "byNode"

type unitStatus struct {
	state     UnitState
	holdUntil time.Time // zero unless FullDisruption with a hold
	nodes     []string
}

// Service applies peer verdicts to Kubernetes.
type Service struct {
	cfg     Config
	log     *slog.Logger
	bus     *hublink.Link
	evm     *events.Metrics
	metrics *metrics
	tracker *Tracker
	patch   *patcher
	now     func() time.Time

	nodes     corelisters.NodeLister
	pods      corelisters.PodLister
	slices    cache.Indexer
	endpoints cache.Indexer
	queue     workqueue.TypedRateLimitingInterface[string]

	mu    sync.RWMutex
	units map[string]unitStatus
	holds jetstream.KeyValue
}

// New wires the service to the cluster's informers (request them before
// the informer factory starts) and the hub.
func New(cfg Config, b *hublink.Link, k *kube.Kube, log *slog.Logger, reg prometheus.Registerer, evm *events.Metrics) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, bus: b, evm: evm, log: log.With("component", "health"),
		metrics: newMetrics(reg),
		tracker: NewTracker(cfg.VoteTTL),
		now:     time.Now,
		units:   map[string]unitStatus{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "health"}),
	}
	s.patch = &patcher{client: k.Client, metrics: s.metrics}

	nodeInf := k.Informers.Core().V1().Nodes()
	s.nodes = nodeInf.Lister()
	if _, err := nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) { s.enqueueNode(o) },
		UpdateFunc: func(old, o any) {
			on, nn := old.(*corev1.Node), o.(*corev1.Node)
			if ReadyStatus(on) != ReadyStatus(nn) || len(on.Spec.Taints) != len(nn.Spec.Taints) {
				s.enqueueNode(o)
			}
		},
	}); err != nil {
		return nil, err
	}

	s.pods = k.Informers.Core().V1().Pods().Lister()

	sliceInf := k.Informers.Discovery().V1().EndpointSlices().Informer()
	if err := sliceInf.AddIndexers(cache.Indexers{byNodeIndex: slicesByNode}); err != nil {
		return nil, err
	}
	s.slices = sliceInf.GetIndexer()
	if _, err := sliceInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.enqueueLost(slicesByNode(o)) },
		UpdateFunc: func(_, o any) { s.enqueueLost(slicesByNode(o)) },
	}); err != nil {
		return nil, err
	}

	epInf := k.Informers.Core().V1().Endpoints().Informer()
	if err := epInf.AddIndexers(cache.Indexers{byNodeIndex: endpointsByNode}); err != nil {
		return nil, err
	}
	s.endpoints = epInf.GetIndexer()
	if _, err := epInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { s.enqueueLost(endpointsByNode(o)) },
		UpdateFunc: func(_, o any) { s.enqueueLost(endpointsByNode(o)) },
	}); err != nil {
		return nil, err
	}
	return s, nil
}

func slicesByNode(o any) ([]string, error) {
	s, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	set := sets.New[string]()
	for _, e := range s.Endpoints {
		if e.NodeName != nil {
			set.Insert(*e.NodeName)
		}
	}
	return sets.List(set), nil
}

func endpointsByNode(o any) ([]string, error) {
	e, ok := o.(*corev1.Endpoints)
	if !ok {
		return nil, nil
	}
	set := sets.New[string]()
	for _, ss := range e.Subsets {
		for _, lists := range [][]corev1.EndpointAddress{ss.Addresses, ss.NotReadyAddresses} {
			for _, a := range lists {
				if a.NodeName != nil {
					set.Insert(*a.NodeName)
				}
			}
		}
	}
	return sets.List(set), nil
}

func (s *Service) enqueueNode(o any) {
	if n, ok := o.(*corev1.Node); ok {
		s.queue.Add(n.Name)
	}
}

// enqueueLost queues the nodes among names that the cloud has lost:
// their endpoints may need to be kept ready.
func (s *Service) enqueueLost(names []string, _ error) {
	for _, name := range names {
		if n, err := s.nodes.Get(name); err == nil && ReadyStatus(n) == corev1.ConditionUnknown {
			s.queue.Add(name)
		}
	}
}

// Protected reports whether node is protected now: the cloud lost it and
// its peers see it healthy, or its whole unit is held. It implements the
// webhook's Policy.
func (s *Service) Protected(node string) bool {
	n, err := s.nodes.Get(node)
	if err != nil {
		return false
	}
	return Protect(ReadyStatus(n), s.tracker.Judge(node, s.now()), s.held(n.Labels[s.cfg.UnitLabel]))
}

// ProtectedNode decides for a Node being written, from its own Ready
// condition (the webhook's NodePolicy).
func (s *Service) ProtectedNode(n *corev1.Node) bool {
	return Protect(ReadyStatus(n), s.tracker.Judge(n.Name, s.now()), s.held(n.Labels[s.cfg.UnitLabel]))
}

// Serving reports whether a pod was serving when its node was lost: it is
// not being deleted and the kubelet last reported its containers ready.
// The node lifecycle controller flips only the pod's Ready condition, so
// ContainersReady keeps the kubelet's last word (the webhook's PodPolicy).
func (s *Service) Serving(namespace, name string) bool {
	p, err := s.pods.Pods(namespace).Get(name)
	if err != nil || p.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.ContainersReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (s *Service) held(unit string) bool {
	if unit == "" {
		return false
	}
	s.mu.RLock()
	st := s.units[unit]
	s.mu.RUnlock()
	return st.state == FullDisruption && s.now().Before(st.holdUntil)
}

// Judge returns the cloud's reading of the votes about node.
func (s *Service) Judge(node string) Judgement { return s.tracker.Judge(node, s.now()) }

// UnitState returns a unit's disruption state and the end of its hold.
func (s *Service) UnitState(unit string) (UnitState, time.Time) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, ok := s.units[unit]
	if !ok {
		return Normal, time.Time{}
	}
	return st.state, st.holdUntil
}

// Run consumes votes and reconciles nodes until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	js := s.bus.JetStream()
	holds, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: HoldBucket, Description: "Since when each edge unit is fully disrupted", History: 1, Replicas: s.cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("health: holds bucket: %w", err)
	}
	s.holds = holds

	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.queue.ShutDown()

	// Every replica knows every vote.
	wg.Go(func() {
		err := events.Follow(ctx, js, events.StreamHealth, []string{events.VoteSubjects}, "votes",
			func(ev events.Event[*atollv1.Vote]) { s.observe(ev.Msg, ev.Published) }, s.log, s.evm)
		if err != nil {
			s.log.Error("following votes stopped", "err", err)
		}
	})
	// One replica handles each vote, at least once.
	wg.Go(func() {
		err := events.Consume(ctx, js, events.VoteConsumer, func(ctx context.Context, ev events.Event[*atollv1.Vote]) error {
			s.observe(ev.Msg, ev.Published)
			return s.reconcile(ctx, ev.Msg.GetNode())
		}, events.ConsumeOptions{Workers: 2, Logger: s.log, Metrics: s.evm})
		if err != nil {
			s.log.Error("consuming votes stopped", "err", err)
		}
	})
	for range s.cfg.Workers {
		wg.Go(func() { s.work(ctx) })
	}

	t := time.NewTicker(s.cfg.Resync)
	defer t.Stop()
	for {
		s.resync(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// observe records a vote and queues its node when the verdict changed.
func (s *Service) observe(v *atollv1.Vote, published time.Time) {
	before := s.tracker.Judge(v.GetNode(), s.now()).Verdict
	if s.tracker.Observe(v, published) && s.tracker.Judge(v.GetNode(), s.now()).Verdict != before {
		s.queue.Add(v.GetNode())
	}
}

func (s *Service) work(ctx context.Context) {
	for {
		name, shutdown := s.queue.Get()
		if shutdown {
			return
		}
		err := s.reconcile(ctx, name)
		switch {
		case err == nil:
			s.queue.Forget(name)
		case ctx.Err() != nil:
		default:
			s.log.Warn("reconcile failed; will retry", "node", name, "err", err)
			s.queue.AddRateLimited(name)
		}
		s.queue.Done(name)
	}
}

// resync re-evaluates every unit's disruption state and queues every lost
// node, so expiring votes and holds take effect without new events.
func (s *Service) resync(ctx context.Context) {
	nodes, err := s.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	now := s.now()
	byUnit := map[string][]*corev1.Node{}
	for _, n := range nodes {
		if unit := n.Labels[s.cfg.UnitLabel]; unit != "" {
			byUnit[unit] = append(byUnit[unit], n)
		}
		if ReadyStatus(n) == corev1.ConditionUnknown {
			s.queue.Add(n.Name)
		}
	}
	s.mu.RLock()
	for unit := range s.units {
		if _, ok := byUnit[unit]; !ok {
			byUnit[unit] = nil // unit vanished: back to Normal
		}
	}
	s.mu.RUnlock()
	protected := 0
	for unit, members := range byUnit {
		ready := make([]corev1.ConditionStatus, 0, len(members))
		fresh := false
		names := make([]string, 0, len(members))
		for _, n := range members {
			ready = append(ready, ReadyStatus(n))
			names = append(names, n.Name)
			fresh = fresh || s.tracker.Judge(n.Name, now).Votes() > 0
		}
		st := unitStatus{state: Disruption(ready, fresh), nodes: names}
		if st.state == FullDisruption && s.cfg.HoldTime > 0 {
			since, err := s.holdSince(ctx, unit, now)
			if err != nil {
				s.log.Warn("cannot record the hold of a silent unit", "unit", unit, "err", err)
				since = now
			}
			st.holdUntil = since.Add(s.cfg.HoldTime)
		} else {
			s.releaseHold(ctx, unit)
		}
		s.mu.Lock()
		prev := s.units[unit]
		if len(members) == 0 {
			delete(s.units, unit)
		} else {
			s.units[unit] = st
		}
		s.mu.Unlock()
		if prev.state != st.state || !prev.holdUntil.Equal(st.holdUntil) {
			s.log.Info("unit disruption", "unit", unit, "state", st.state, "was", prev.state, "hold_until", st.holdUntil)
			for _, n := range names {
				s.queue.Add(n)
			}
		}
		s.metrics.setUnitState(unit, st.state, len(members) == 0)
		for _, n := range members {
			if Protect(ReadyStatus(n), s.tracker.Judge(n.Name, now), s.held(unit)) {
				protected++
			}
		}
	}
	s.metrics.protected.Set(float64(protected))
}

// holdSince returns since when unit is fully disrupted, recording now if
// no replica has yet: the first Create wins.
func (s *Service) holdSince(ctx context.Context, unit string, now time.Time) (time.Time, error) {
	if _, err := s.holds.Create(ctx, unit, []byte(now.UTC().Format(time.RFC3339Nano))); err == nil {
		return now, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return time.Time{}, err
	}
	e, err := s.holds.Get(ctx, unit)
	if err != nil {
		return time.Time{}, err
	}
	return time.Parse(time.RFC3339Nano, string(e.Value()))
}

func (s *Service) releaseHold(ctx context.Context, unit string) {
	s.mu.RLock()
	wasFull := s.units[unit].state == FullDisruption
	s.mu.RUnlock()
	if !wasFull {
		return
	}
	if err := s.holds.Delete(ctx, unit); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("cannot release the hold of a unit", "unit", unit, "err", err)
	}
}

// reconcile brings one node, its annotations, and its pods' endpoints in
// line with the decision for it. It is idempotent.
func (s *Service) reconcile(ctx context.Context, name string) error {
	n, err := s.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		s.tracker.Forget(name)
		return nil
	}
	if err != nil {
		return err
	}
	unit := n.Labels[s.cfg.UnitLabel]
	j := s.tracker.Judge(name, s.now())
	if unit == "" && j.Votes() == 0 {
		return nil // not an edge node
	}
	state, hold := s.UnitState(unit)
	if !s.held(unit) {
		hold = time.Time{}
	}
	var errs []error
	want := Annotations(j, state, hold)
	errs = append(errs, s.patch.node(ctx, n, func(cur *corev1.Node) ([]byte, types.PatchType, error) {
		data, err := AnnotationsPatch(cur.Annotations, want)
		return data, types.MergePatchType, err
	}))
	if !Protect(ReadyStatus(n), j, s.held(unit)) {
		return errors.Join(errs...)
	}
	errs = append(errs, s.patch.node(ctx, n, func(cur *corev1.Node) ([]byte, types.PatchType, error) {
		data, err := NodeTaintPatch(cur, s)
		return data, types.JSONPatchType, err
	}))
	objs, _ := s.slices.ByIndex(byNodeIndex, name)
	for _, o := range objs {
		errs = append(errs, s.patch.endpointSlice(ctx, o.(*discoveryv1.EndpointSlice), s))
	}
	objs, _ = s.endpoints.ByIndex(byNodeIndex, name)
	for _, o := range objs {
		errs = append(errs, s.patch.endpoints(ctx, o.(*corev1.Endpoints), s))
	}
	return errors.Join(errs...)
}
