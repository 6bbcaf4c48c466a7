package health

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrlmanager "sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/protect"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// nodeIndex indexes EndpointSlices and Endpoints by the nodes of their
// endpoints.
const nodeIndex = "atoll.io/nodes"

// unitIndex indexes Nodes by their unit label.
const unitIndex = "atoll.io/unit"

// catchUpRetry is how soon a reconcile deferred for the ballots to catch
// up runs again.
const catchUpRetry = time.Second

// ControllerName names the reconciler (its workqueue metrics and logs).
const ControllerName = "health"

func nodeRef(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

// setupWithManager registers the informers every replica reads (the
// webhook asks any replica), the indexes, the reconciler and the ballot
// consumer.
func (s *Service) setupWithManager(m *manager.Manager) error {
	ctx := context.Background()
	idx := m.GetFieldIndexer()
	if err := idx.IndexField(ctx, &discoveryv1.EndpointSlice{}, nodeIndex, func(o client.Object) []string {
		return slicesByNode(o.(*discoveryv1.EndpointSlice))
	}); err != nil {
		return fmt.Errorf("index endpointslices: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Endpoints{}, nodeIndex, func(o client.Object) []string {
		return endpointsByNode(o.(*corev1.Endpoints))
	}); err != nil {
		return fmt.Errorf("index endpoints: %w", err)
	}
	if err := idx.IndexField(ctx, &corev1.Node{}, unitIndex, func(o client.Object) []string {
		if unit := s.cfg.Units.UnitOf(o.GetLabels()); unit != "" {
			return []string{unit}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index nodes: %w", err)
	}
	// The controller's watches start on the leader only; the cache must
	// hold these on every replica.
	for _, o := range []client.Object{&corev1.Node{}, &corev1.Pod{}, &discoveryv1.EndpointSlice{}, &corev1.Endpoints{}, &coordinationv1.Lease{}, &corev1.ConfigMap{}} {
		inf, err := m.GetCache().GetInformer(ctx, o)
		if err != nil {
			return fmt.Errorf("informer %T: %w", o, err)
		}
		if _, ok := o.(*corev1.Node); ok {
			if _, err := inf.AddEventHandler(s.members.Handler()); err != nil {
				return fmt.Errorf("node informer handler: %w", err)
			}
			if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: s.nodeReturned}); err != nil {
				return fmt.Errorf("node informer handler: %w", err)
			}
		}
	}
	err := builder.ControllerManagedBy(m).
		Named(ControllerName).
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				on, nn := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
				return ReadyStatus(on) != ReadyStatus(nn) || len(on.Spec.Taints) != len(nn.Spec.Taints)
			},
		})).
		Watches(&discoveryv1.EndpointSlice{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return s.lost(ctx, slicesByNode(o.(*discoveryv1.EndpointSlice)))
		})).
		Watches(&corev1.Endpoints{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			return s.lost(ctx, endpointsByNode(o.(*corev1.Endpoints)))
		})).
		// Ballots and resyncs: the only way in besides the watches.
		WatchesRawSource(source.Channel(s.work, &handler.EnqueueRequestForObject{})).
		// A new term reconciles every Node, as a new leader's would.
		WatchesRawSource(m.TermSource(&corev1.NodeList{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: s.cfg.Workers}).
		Complete(m.LeaderOnly(s))
	if err != nil {
		return fmt.Errorf("controller: %w", err)
	}
	// The informational writes run on every replica, each write on the
	// leader only (annotate); the shared durable consumer feeds the
	// leader's workqueue, one run per term.
	if err := m.Add(ctrlmanager.RunnableFunc(s.writeInfo)); err != nil {
		return err
	}
	m.OnTerm(s.consumeBallots)
	return nil
}

// consumeBallots handles each ballot once across replicas (at least
// once): it records the ballot and enqueues the nodes whose verdict it
// changed, then the ballot is acked (see the package doc). It runs for
// each term this replica leads, beside the leader's ballot follower: whichever of the two
// records a ballot first enqueues what it changed, and the other finds
// nothing left to change. Nothing is lost to a new leader: its controller
// reconciles every Node when it starts. Enqueueing every vote of every
// ballot instead would send a unit's size of workqueue events per
// keep-alive, enough in large units to block the follower behind the
// reconciler's channel.
func (s *Service) consumeBallots(ctx context.Context) {
	err := eventbus.Consume(ctx, s.bus.JetStream(), events.BallotConsumer, func(ctx context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		if err := s.validBallot(ev.Msg, ev.Published); err != nil {
			return eventbus.Reject(err)
		}
		for _, n := range s.observeBallot(ctx, ev.Msg, ev.Published) {
			s.enqueue(ctx, n)
		}
		return nil
	}, eventbus.ConsumeOptions{Workers: 2, Logger: s.log, Metrics: s.evm, Seen: s.ballotSeen})
	if err != nil && ctx.Err() == nil {
		s.log.Error("consuming ballots stopped", "err", err)
	}
}

// ballotSeen tells, before a ballot is decoded, whether the tracker has
// recorded it or a later one of its voter (stored at or after it): on
// the leader the follower and the shared consumer both get every ballot,
// and whichever records it enqueues what it changed, so the other skips
// it. A ballot the first refused (invalid) is not recorded, so the
// other decodes it and refuses it too (the shared consumer terminates it
// with the reason).
func (s *Service) ballotSeen(subject string, stored time.Time) bool {
	_, voter, err := events.ParseBallotSubject(subject)
	if err != nil {
		return false
	}
	last := s.tracker.LastBallot(voter)
	return !last.IsZero() && !stored.After(last)
}

func slicesByNode(s *discoveryv1.EndpointSlice) []string {
	set := sets.New[string]()
	for _, e := range s.Endpoints {
		if e.NodeName != nil {
			set.Insert(*e.NodeName)
		}
	}
	return sets.List(set)
}

func endpointsByNode(e *corev1.Endpoints) []string {
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
	return sets.List(set)
}

// lost maps names to requests for the nodes the cloud has lost: their
// endpoints may need to be kept ready.
func (s *Service) lost(ctx context.Context, names []string) []reconcile.Request {
	var out []reconcile.Request
	for _, name := range names {
		var n corev1.Node
		if err := s.cache.Get(ctx, types.NamespacedName{Name: name}, &n); err == nil && ReadyStatus(&n) == corev1.ConditionUnknown {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Name: name}})
		}
	}
	return out
}

// Reconcile brings one node, its annotations and taints (one patch), and
// its pods' endpoints (one patch per object) in line with the decision
// for it. It is idempotent; errors requeue with backoff.
func (s *Service) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	// Until this replica's ballots have caught up with the stream, a
	// verdict may be missing votes the stream holds: writing it could
	// drop a node's protection (a new leader's first writes). Wait.
	if err := s.Ready(ctx); err != nil {
		s.metrics.deferred.Inc()
		return reconcile.Result{RequeueAfter: catchUpRetry}, nil
	}
	name := req.Name
	// Read only (the patcher writes from its own copy): every ballot
	// enqueues the nodes it names, so this runs for each, and a deep copy
	// of the Node was most of its cost.
	var n corev1.Node
	err := s.cache.Get(ctx, req.NamespacedName, &n, client.UnsafeDisableDeepCopy)
	if apierrors.IsNotFound(err) {
		s.tracker.Forget(name)
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	unit := s.cfg.Units.Of(&n)
	if _, marked := n.Annotations[wellknown.AnnotationVerdict]; unit == "" && !marked {
		return reconcile.Result{}, nil // not an edge node, and never was
	}
	// A member lost by the cloud may make its unit silent: the state
	// first, so one patch carries the hold and the verdict of this
	// transition.
	if unit != "" && s.unitStale(unit, name, ReadyStatus(&n)) {
		s.refreshUnit(ctx, unit)
	}
	j := s.tally(&n, s.now())
	_, hold := s.UnitState(unit)
	if !s.held(unit) {
		hold = time.Time{}
	}
	var errs []error
	if protectionWrite(&n, j, hold, s.ProtectedNode(&n)) {
		// The taint or the hold changes: a protection write, made now on
		// the protection client, carrying the annotations along (one
		// patch per object).
		errs = append(errs, s.patch.node(ctx, &n, func(cur *corev1.Node) ([]byte, error) {
			return NodePatch(cur, Annotations(j, hold, cur.Annotations, s.now()), s.ProtectedNode(cur))
		}))
	} else if p, err := AnnotationPatch(&n, Annotations(j, hold, n.Annotations, s.now())); err != nil || p != nil {
		// Only the verdict annotations change (or a hold's end): the
		// informational queue writes them, apart from this reconcile, one
		// resync period from now. The verdicts of one transition often
		// move one event at a time (each voter's link loss or ballot),
		// and its protection write (a unit's hold) may follow them: the
		// delay lets that write carry them all, or the queue write them
		// all at once, as they are then.
		s.info.AddAfter(name, s.cfg.Resync)
	}
	if !Protect(&n, j, s.held(unit)) {
		return reconcile.Result{}, errors.Join(errs...)
	}
	var slices discoveryv1.EndpointSliceList
	if err := s.cache.List(ctx, &slices, client.MatchingFields{nodeIndex: name}); err != nil {
		errs = append(errs, err)
	}
	for i := range slices.Items {
		errs = append(errs, s.patch.endpointSlice(ctx, &slices.Items[i], s))
	}
	var eps corev1.EndpointsList
	if err := s.cache.List(ctx, &eps, client.MatchingFields{nodeIndex: name}); err != nil {
		errs = append(errs, err)
	}
	for i := range eps.Items {
		errs = append(errs, s.patch.endpoints(ctx, &eps.Items[i], s))
	}
	return reconcile.Result{}, errors.Join(errs...)
}

// protectionWrite reports whether n's patch adds to what protects it: it
// removes its unreachable taint, or sets the hold annotation the guard
// webhook reads. A hold's end is not urgent (the guard webhook asks a
// replica, which answers from its own state, and reads the annotation
// only while none answers): the informational queue writes it, with the
// verdict that usually ends the hold.
func protectionWrite(n *corev1.Node, j Tally, hold time.Time, protected bool) bool {
	if _, changed := protect.NodeTaints(n, protected); changed {
		return true
	}
	return !hold.IsZero() && n.Annotations[wellknown.AnnotationHoldUntil] != hold.UTC().Format(time.RFC3339)
}

// writeInfo runs the informational writes until ctx is done. It runs on
// every replica; a replica that does not lead drops what is queued (its
// next leader's resync queues it again).
func (s *Service) writeInfo(ctx context.Context) error {
	go func() { <-ctx.Done(); s.info.ShutDown() }()
	var wg sync.WaitGroup
	for range s.cfg.InfoWorkers {
		wg.Go(func() {
			for {
				name, quit := s.info.Get()
				if quit {
					return
				}
				if err := s.annotate(ctx, name); err != nil {
					s.log.Debug("annotation write failed; retrying", "node", name, "err", err)
					s.info.AddRateLimited(name)
				} else {
					s.info.Forget(name)
				}
				s.info.Done(name)
			}
		})
	}
	wg.Wait()
	return nil
}

// annotate writes node's verdict annotations as they are now (not as they
// were when it was queued), leaving its taints alone: those are the
// reconciler's.
func (s *Service) annotate(ctx context.Context, name string) error {
	if !s.leads() {
		return nil
	}
	if err := s.Ready(ctx); err != nil {
		s.info.AddAfter(name, catchUpRetry)
		return nil
	}
	var n corev1.Node
	err := s.cache.Get(ctx, types.NamespacedName{Name: name}, &n)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	unit := s.cfg.Units.Of(&n)
	if s.undecided(ctx, unit) {
		// The unit went quiet and is not yet known cut off or only
		// agent-silent: a hold may follow, to be written with these
		// annotations in one patch.
		s.info.AddAfter(name, s.cfg.Resync)
		return nil
	}
	j := s.tally(&n, s.now())
	_, hold := s.UnitState(unit)
	if !s.held(unit) {
		hold = time.Time{}
	}
	if protectionWrite(&n, j, hold, s.ProtectedNode(&n)) {
		s.enqueue(ctx, name) // the reconciler writes it, with the annotations
		return nil
	}
	return s.infoW.node(ctx, &n, func(cur *corev1.Node) ([]byte, error) {
		return AnnotationPatch(cur, Annotations(j, hold, cur.Annotations, s.now()))
	})
}

var (
	_ protect.Policy         = (*Service)(nil)
	_ protect.NodePolicy     = (*Service)(nil)
	_ protect.PodPolicy      = (*Service)(nil)
	_ protect.EndpointPolicy = (*Service)(nil)
)
