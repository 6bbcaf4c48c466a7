// Package health is the cloud half of distributed health. It follows the
// votes of every edge unit and, for a node that kube-controller-manager's
// node lifecycle controller marked Ready=Unknown because its kubelet
// stopped posting status (the cloud lost it: protect.LostByCloud), applies
// the peers' verdict (a Ready condition the kubelet set itself is never
// overridden):
//
//   - peers say healthy: annotate the node, remove the
//     node.kubernetes.io/unreachable:NoExecute taint (keep NoSchedule), and
//     keep its pods' endpoints ready in EndpointSlices and Endpoints;
//   - peers say unhealthy (or nothing): annotate; Kubernetes evicts.
//
// When a whole unit falls silent (every node Unknown, no fresh vote) its
// pods are held for HoldTime before Kubernetes may proceed. The mutating
// webhook (cloud/webhook) applies the same decision on every write, through
// Service.Protected and the rules of internal/protect, because the node
// lifecycle and endpoint controllers keep re-applying their own view.
//
// # Reads on every replica, writes on the leader
//
// Every replica follows all ballots (an ordered consumer) into its Tracker
// and computes the units' disruption states: the webhook may be called on
// any replica and must answer from that state. Writes happen only in the
// Reconciler, a controller-runtime controller of the manager
// (cloud/manager), which runs on the replica holding the leader Lease. Its
// work comes from the manager's Node, EndpointSlice and Endpoints watches
// and, through a source.Channel, from the shared durable ballot consumer,
// which also runs on the leader only. The consumer's callback records the
// ballot in the tracker and enqueues the nodes whose verdict it changed;
// it never patches. The
// workqueue merges every cause for a node into one reconcile, and one
// reconcile writes at most one patch per object: annotations and taints
// in one Node patch, one patch per EndpointSlice or Endpoints.
//
// # Ballots and their freshness
//
// Edge voters send ballots (one message with a voter's votes on every
// other member of its unit) when something changes and as a 30 s
// keep-alive (edge/voter); a ballot is the only health message a voter
// sends. Each vote counts until the first of: the ballot's TTL after the
// hub stored it, the voter's next ballot (which replaces the whole
// previous one; duplicates and older ballots are ignored), or the hub
// reporting the voter's leaf connection closed after storing it
// (FollowLinks: the hub servers' DISCONNECT system events, recorded in
// LinksBucket so every replica, and one started later, applies them). A
// link reported closed after the voter linked again (a server noticing a
// silently dead link late) cuts nothing: the voter's ballot over its new
// link replaces its votes (the CONNECT events; Tracker.Superseded).
//
// # Write priorities
//
// Protection writes (a node's unreachable taint, its pods' endpoint
// readiness, the hold annotation the guard webhook reads) are made by the
// reconciler on a client with its own rate limiter (Config.Protect); a
// reconcile that would only change verdict annotations hands the node to
// a separate workqueue written on another client (Config.Info), so a
// backlog of annotations never holds a reconcile worker nor takes the
// protection writes' tokens. That queue writes a node one resync period
// after it was handed over, as it is then: the verdicts of one transition
// arrive one event at a time (each voter's link loss or ballot), and the
// wait lets them, and a protection write that follows (a silent unit's
// hold), go out in one patch per Node. A hold's end is informational
// too (the guard webhook reads the annotation only while no replica
// answers). So that the hold is known as soon as the unit falls silent,
// a unit's disruption state is recomputed at the events that may make it
// silent or end its silence (a voter's link lost, a member lost by the
// cloud, a vote from a silent unit), not only at the resync.
//
// # Ack semantics
//
// A ballot is acked once it is recorded in the tracker and its nodes are
// in the workqueue, before the reconcile. That is at least once for the
// ballot's effect: the effect is the tracker state, which every replica
// rebuilds from the HEALTH stream by itself (the follower), and a
// reconcile derives the writes from that state alone, idempotently. If the
// leader dies between ack and reconcile, the next leader's controller lists
// every Node when it starts and reconciles each of them from its own
// tracker, and the periodic resync requeues every lost node; nothing
// depends on redelivering the acked ballot.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/units"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/protect"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// HoldBucket is the KV bucket recording since when each unit is fully
// disrupted, so every replica (and a restarted one) holds it equally long.
const HoldBucket = "atoll_unit_holds"

// LinksBucket records, per edge node, when the hub last reported its leaf
// link closed (FollowLinks writes, every replica follows), so every
// replica, and one started later, stops counting the ballots the voter
// had stored by then.
const LinksBucket = "atoll_voter_links"

type unitStatus struct {
	state     UnitState
	holdUntil time.Time // zero unless FullDisruption with a hold
	// rejoining: since when the held unit has been heard again while
	// kept held (Config.RejoinGrace); zero otherwise.
	rejoining time.Time
	nodes     []string
	ready     map[string]corev1.ConditionStatus // each member's Ready status the state was computed with
}

// Service keeps the votes of every ballot and applies peer verdicts to
// Kubernetes.
type Service struct {
	cfg     Config
	log     *slog.Logger
	bus     *hublink.Link
	evm     *eventbus.Metrics
	metrics *metrics
	tracker *Tracker
	now     func() time.Time
	// started is when this replica began: a voter it has heard nothing
	// from is unheard since then (member).
	started time.Time

	cache client.Reader                                // the manager's cache
	patch *patcher                                     // protection writes
	infoW *patcher                                     // informational writes
	info  workqueue.TypedRateLimitingInterface[string] // nodes whose annotations to write
	work  chan event.GenericEvent                      // → the reconciler's workqueue
	leads func() bool                                  // this replica leads (writes)
	// leaderSilent reports whether the leader's Lease went unrenewed
	// (repair.go).
	leaderSilent func(context.Context) (bool, error)
	ballots      atomic.Pointer[eventbus.Consumer] // follows every ballot, on every replica; set by Run

	links      atomic.Pointer[jetstream.KeyValue] // LinksBucket; set by Run
	linksReady atomic.Bool                        // LinksBucket read up to its end at start

	mu       sync.RWMutex
	units    map[string]unitStatus
	holds    jetstream.KeyValue
	recorded map[string]bool // units with a record in holds
	watchers []func(unit string, state UnitState)
	writes   []func(Write)
	resynced atomic.Bool // the unit states have been computed once
	// unitLocks (unit → *sync.Mutex) serialize the updates of one unit's
	// state (updateUnit).
	unitLocks sync.Map
	// members indexes each unit's members (the Node informer's events).
	members *units.Index
	// returned: node → when it turned Ready again while protected
	// (KeepsEndpoints).
	returned sync.Map
	// protected keeps the protected set (protected.go); nil: none.
	protected *protectedSets
}

// New builds the service on the manager m: it registers the informers
// and indexes it reads, the reconciler (leader only) and the ballot
// consumer (leader only). Call it before the manager starts; Run does the rest.
func New(cfg Config, b *hublink.Link, m *manager.Manager, log *slog.Logger, reg prometheus.Registerer, evm *eventbus.Metrics) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{
		cfg: cfg, bus: b, evm: evm, log: log.With("component", "health"),
		metrics:      newMetrics(reg),
		tracker:      NewTracker(cfg.VoteTTL),
		now:          time.Now,
		units:        map[string]unitStatus{},
		members:      units.NewIndex(cfg.Units),
		protected:    &protectedSets{namespace: cfg.ProtectedNamespace, written: map[string]map[string]string{}},
		cache:        m.GetClient(),
		work:         make(chan event.GenericEvent),
		leads:        m.Leading,
		leaderSilent: m.LeaderSilent,
	}
	s.started = s.now()
	s.tracker.SetCutGrace(cfg.CutGrace)
	var err error
	if s.patch, err = newPatcher(m, cfg.Protect, s.metrics); err != nil {
		return nil, fmt.Errorf("health: protection client: %w", err)
	}
	s.patch.wrote = s.wrote
	if s.infoW, err = newPatcher(m, cfg.Info, s.metrics); err != nil {
		return nil, fmt.Errorf("health: informational client: %w", err)
	}
	s.info = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "health-annotations"})
	if err := s.setupWithManager(m); err != nil {
		return nil, fmt.Errorf("health: %w", err)
	}
	return s, nil
}

// Protected reports whether node is protected now: the cloud lost it and
// its peers see it healthy, or its whole unit is held. It implements
// protect.Policy.
func (s *Service) Protected(node string) bool {
	var n corev1.Node
	if err := s.cache.Get(context.Background(), types.NamespacedName{Name: node}, &n); err != nil {
		return false
	}
	return s.ProtectedNode(&n)
}

// ProtectedNode decides for a Node being written, from its own Ready
// condition (protect.NodePolicy). Until this replica has read the ballots
// and computed the units' states once (a start, a restart after a crash),
// the decision persisted on the node stands: its verdict annotation
// healthy, or its unit's hold in force (the annotations the guard webhook
// reads while no replica answers). A replica that starts never admits,
// from a partial view, the write that would drop a node's protection.
func (s *Service) ProtectedNode(n *corev1.Node) bool {
	// Only a node the cloud lost is ever protected: tally no other.
	if !protect.LostByCloud(n) {
		return false
	}
	if !s.decided() {
		return persistedProtection(n, s.now())
	}
	now, unit := s.now(), s.cfg.Units.Of(n)
	return Protect(n, s.tally(n, now), s.held(unit) || s.holdsWith(unit, n, now))
}

// holdsWith reports whether unit is to be held now that n is lost: its
// state was computed with n Ready, and with n as it is being written the
// cloud hears none of the unit's members (FullDisruption, a hold that
// begins now). The node lifecycle controller's taint can reach the
// webhook before the informer's event of its Ready=Unknown has moved the
// unit's state; the event path records the hold, this only decides.
func (s *Service) holdsWith(unit string, n *corev1.Node, now time.Time) bool {
	if unit == "" || s.cfg.HoldTime <= 0 || !s.unitStale(unit, n.Name, ReadyStatus(n)) {
		return false
	}
	if st, _ := s.UnitState(unit); st == FullDisruption {
		return false // held already, or its hold has run out: held decides
	}
	ctx := context.Background()
	var list corev1.NodeList
	if err := s.cache.List(ctx, &list, client.MatchingFields{unitIndex: unit}, client.UnsafeDisableDeepCopy); err != nil {
		return false
	}
	members := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		members[i] = &list.Items[i]
		if members[i].Name == n.Name {
			members[i] = n
		}
	}
	st, _, _ := s.disruption(ctx, members, now)
	return st == FullDisruption
}

// KeepsEndpoints reports whether the serving pods of node keep their
// endpoints ready (protect.EndpointPolicy): it is protected, or it was
// until its kubelet reported again less than ReturnGrace ago. The node
// lifecycle controller marked its pods not ready while it was lost (their
// containers still ready: Serving), and the kubelet posts their status
// moments after the node's own: meanwhile the endpoints of a node its
// peers saw healthy throughout would turn not ready for nothing.
func (s *Service) KeepsEndpoints(node string) bool {
	var n corev1.Node
	if err := s.cache.Get(context.Background(), types.NamespacedName{Name: node}, &n); err != nil {
		return false
	}
	if s.ProtectedNode(&n) {
		return true
	}
	at, ok := s.returned.Load(node)
	if !ok {
		return false
	}
	if ReadyStatus(&n) != corev1.ConditionTrue || s.now().Sub(at.(time.Time)) >= s.cfg.ReturnGrace {
		s.returned.CompareAndDelete(node, at)
		return false
	}
	return true
}

// nodeReturned records, from the Node informer's update events, a node
// that turns Ready while protected (KeepsEndpoints).
func (s *Service) nodeReturned(oldObj, newObj any) {
	if s.cfg.ReturnGrace <= 0 {
		return
	}
	old, ok1 := oldObj.(*corev1.Node)
	n, ok2 := newObj.(*corev1.Node)
	if !ok1 || !ok2 || ReadyStatus(n) != corev1.ConditionTrue || ReadyStatus(old) == corev1.ConditionTrue {
		return
	}
	if s.ProtectedNode(old) {
		s.returned.Store(n.Name, s.now())
		s.log.Info("protected node back: its pods' endpoints stay ready while its kubelet posts their status", "node", n.Name, "grace", s.cfg.ReturnGrace)
	}
}

// decided reports whether this replica decides from its own state: it has
// caught up with the ballots and computed the units' states once.
func (s *Service) decided() bool {
	return s.resynced.Load() && s.Ready(context.Background()) == nil
}

// tally reads the votes about n that count: cast for n's unit by another
// node that is a current member of it, by internal/quorum's rule over the
// unit's current size (n's own vote never counts; a verdict needs votes
// from more than half of the other members). A node in no unit is never
// tallied (and so never protected), whatever votes name it; a vote from a
// node that left the unit, or about a node that left it, stops counting at
// once.
func (s *Service) tally(n *corev1.Node, now time.Time) Tally {
	return s.tallyIn(n.Name, s.cfg.Units.Of(n), now)
}

// tallyIn is tally for the node name in unit ("" for none).
func (s *Service) tallyIn(name, unit string, now time.Time) Tally {
	if unit == "" {
		return Tally{}
	}
	return s.tracker.Tally(name, now, s.members.Size(unit), s.countsIn(unit))
}

// countsIn accepts the votes that count in unit: cast for it, by a node
// that is a member of it now.
func (s *Service) countsIn(unit string) func(voter, voteUnit string) bool {
	return func(voter, voteUnit string) bool { return voteUnit == unit && s.unitOf(voter) == unit }
}

// unitOf is the unit of the named node, "" when it is in none or unknown.
// A tally reads the unit of every voter and member: from the index the
// Node informer keeps, not a read of the cache.
func (s *Service) unitOf(node string) string { return s.members.UnitOf(node) }

// validBallot checks what the tracker cannot: that the ballot's TTL and
// its own timestamp are within bounds. A vote about the voter itself is
// never counted (votesOf); membership is checked when votes are tallied,
// since it can change after a ballot is recorded.
func (s *Service) validBallot(b *atollv1.Ballot, published time.Time) error {
	if ttl := b.GetTtl().AsDuration(); ttl > s.cfg.MaxVoteTTL {
		return fmt.Errorf("%w: ttl %s above the maximum %s", ErrBallotRejected, ttl, s.cfg.MaxVoteTTL)
	}
	if t := b.GetTime(); t == nil {
		return fmt.Errorf("%w: no time", ErrBallotRejected)
	} else if skew := t.AsTime().Sub(published); skew > s.cfg.MaxVoteSkew || skew < -s.cfg.MaxVoteSkew {
		return fmt.Errorf("%w: ballot time %s is %s from the hub's %s (max skew %s)", ErrBallotRejected,
			t.AsTime().UTC().Format(time.RFC3339), skew.Round(time.Millisecond), published.UTC().Format(time.RFC3339), s.cfg.MaxVoteSkew)
	}
	return nil
}

// Serving reports whether a pod was serving when its node was lost: it is
// not being deleted and the kubelet last reported its containers ready.
// The node lifecycle controller flips only the pod's Ready condition, so
// ContainersReady keeps the kubelet's last word (protect.PodPolicy).
func (s *Service) Serving(namespace, name string) bool {
	var p corev1.Pod
	if err := s.cache.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: name}, &p); err != nil || p.DeletionTimestamp != nil {
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

// Tally returns the cloud's reading of the votes about node that count.
func (s *Service) Tally(node string) Tally {
	return s.tallyIn(node, s.unitOf(node), s.now())
}

// Votes returns the fresh votes about node that count (those Tally
// reads), sorted by voter: who voted, what, and when.
func (s *Service) Votes(node string) []Vote {
	unit := s.unitOf(node)
	if unit == "" {
		return nil
	}
	return s.tracker.Votes(node, s.now(), s.countsIn(unit))
}

// LinkDown reports whether the hub reported node's leaf link closed
// after the latest ballot it stored from the node: the node's
// agent is cut from the cloud until it sends again.
func (s *Service) LinkDown(node string) bool { return s.tracker.LinkDown(node) }

// LastBallot returns when the hub stored voter's latest ballot this
// replica recorded (zero: none).
func (s *Service) LastBallot(voter string) time.Time { return s.tracker.LastBallot(voter) }

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

// UnitStateKnown is UnitState's state, and whether this replica has
// computed the units' states yet: before its first resync (which waits
// for the ballots to catch up) UnitState says Normal for every unit,
// which may not be so.
func (s *Service) UnitStateKnown(unit string) (UnitState, bool) {
	st, _ := s.UnitState(unit)
	return st, s.resynced.Load()
}

// OnUnitState registers fn, called with a unit and its new disruption
// state each time the state changes (UnitState already answers the new
// one); a unit first seen counts as a change, one seen again in the same
// state does not. Calls come from the service's resync loop and from the
// events that move a unit's state (a voter's link lost, a silent unit's
// ballot, a member lost by the cloud), one at a time per unit but
// concurrently for different units: fn must not block and must be safe
// for concurrent use.
func (s *Service) OnUnitState(fn func(unit string, state UnitState)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, fn)
}

// OnProtectiveWrite registers fn, called after each protection write the
// apiserver accepted (a Node's taints and annotations, an EndpointSlice's
// or Endpoints' readiness), with what was written. Writes happen on the
// leader only. Calls come from the reconcile workers: fn must not block.
func (s *Service) OnProtectiveWrite(fn func(Write)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes = append(s.writes, fn)
}

func (s *Service) wrote(w Write) {
	s.mu.RLock()
	fns := s.writes
	s.mu.RUnlock()
	for _, fn := range fns {
		fn(w)
	}
}

// Ready passes once this replica's ballots have caught up with the HEALTH
// stream as it was at start (readiness check ReadinessCheck).
func (s *Service) Ready(context.Context) error {
	ballots := s.ballots.Load()
	if ballots == nil {
		return errors.New("ballot follower not started")
	}
	if !s.linksReady.Load() {
		return errors.New("voter link losses not read yet")
	}
	return ballots.Ready()
}

// maxTallied is how many nodes whose vote a ballot changes observeBallot
// tallies before and after to tell which verdicts changed; a ballot that
// changes more returns them all, for the reconciles to tally.
const maxTallied = 8

// observeBallot records a ballot; it returns the nodes whose verdict
// changed (or may have: see maxTallied).
func (s *Service) observeBallot(ctx context.Context, b *atollv1.Ballot, published time.Time) []string {
	if published.IsZero() {
		published = time.Now()
	}
	made, ttl := b.GetTime().AsTime(), b.GetTtl().AsDuration()
	// Recorded already (the leader's follower and shared consumer both
	// deliver every ballot), older than the one recorded, or sent before
	// its voter's link closed: nothing to record, nothing to tally.
	if !s.tracker.Newer(b.GetVoter(), made, published) {
		return nil
	}
	// A ballot whose TTL passed before it was handled (a consumer behind
	// by more than the TTL) changes no verdict: its votes count for
	// nothing, and so do the voter's older ones it replaces. It is
	// recorded without tallying: tallying a large unit's nodes before and
	// after each such ballot is O(unit²), and would keep a consumer that
	// fell that far behind from ever catching up.
	if ttl > 0 && !published.Add(ttl).After(s.now()) {
		s.tracker.ObserveBallot(b, published)
		s.metrics.lateBallots.Inc()
		return nil
	}
	// A keep-alive that repeats the voter's fresh votes changes no
	// verdict: renewed in place, nothing to tally.
	if s.tracker.Refresh(b, published) {
		s.endSilence(ctx, b.GetVoter())
		return nil
	}
	// Only the nodes whose vote from this voter changes can change
	// verdict (and those it stops naming, tallied after only).
	changing := s.tracker.Changing(b, published)
	// A voter's first ballot, or its first after its votes expired,
	// changes every vote it carries: its nodes go to the reconciles
	// untallied, which tally each once however many ballots of the unit
	// name it, and write only what changed (tallying them all here,
	// before and after, would be O(unit²) per ballot).
	tally := len(changing) <= maxTallied
	before := map[string]atollv1.Verdict{}
	if tally {
		for _, node := range changing {
			before[node] = s.Tally(node).Verdict
		}
	}
	touched := s.tracker.ObserveBallot(b, published)
	// A ballot from a silent unit ends its hold: the state first, so the
	// reconciles write the hold's end with the verdicts.
	// (Any ballot: one that repeats fresh votes touches no node, but it
	// still proves the unit's link is back.)
	s.endSilence(ctx, b.GetVoter())
	if !tally {
		return touched
	}
	var changed []string
	for _, node := range touched {
		if v, ok := before[node]; !ok || s.Tally(node).Verdict != v {
			changed = append(changed, node)
		}
	}
	return changed
}

// endSilence ends the hold of voter's unit when it is silent: a ballot
// from it, even one that repeats fresh votes, proves its link is back.
func (s *Service) endSilence(ctx context.Context, voter string) {
	if unit := s.unitOf(voter); s.silentUnit(unit) {
		s.refreshUnit(ctx, unit)
	}
}

// LinkLost tells the service that the hub closed voter's leaf connection
// at at (its system events, FollowLinks): every vote the voter sent before
// stops counting now, and the nodes it voted on are reconciled.
func (s *Service) LinkLost(ctx context.Context, voter string, at time.Time) {
	nodes := s.tracker.Cut(voter, at)
	if len(nodes) > 0 {
		s.log.Info("voter's leaf link closed: its votes stop counting", "voter", voter, "at", at, "nodes", len(nodes))
	}
	// The loss may make the unit silent (held): its state first, so the
	// reconciles below write the hold with the verdicts, in one patch.
	units := map[string]bool{s.unitOf(voter): true}
	for _, n := range nodes {
		units[s.unitOf(n)] = true
	}
	for unit := range units {
		s.refreshUnit(ctx, unit)
	}
	for _, n := range nodes {
		s.enqueue(ctx, n)
	}
}

// Run follows the ballots and keeps the units' states until ctx is done.
// It runs on every replica.
func (s *Service) Run(ctx context.Context) error {
	js := s.bus.JetStream()
	var holds jetstream.KeyValue
	err := eventbus.UntilSet(ctx, func(ctx context.Context) (err error) {
		holds, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: HoldBucket, Description: "Since when each edge unit is fully disrupted", History: 1, Replicas: s.cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("health: holds bucket: %w", err)
	}
	// Holds recorded before this start: a unit whose hold is recorded but
	// that is no longer fully disrupted (it recovered while no replica
	// ran) must lose its record, or its next disruption would inherit the
	// old start and be released at once.
	recorded := map[string]bool{}
	keys, err := holds.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("health: holds bucket: %w", err)
	}
	for k := range keys.Keys() {
		recorded[k] = true
	}
	s.mu.Lock()
	s.holds, s.recorded = holds, recorded
	s.mu.Unlock()

	// Link losses first: a ballot stored before its voter's link closed
	// must not count when the followers below deliver it.
	var links jetstream.KeyValue
	err = eventbus.UntilSet(ctx, func(ctx context.Context) (err error) {
		links, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: LinksBucket, Description: "When each edge node's leaf link to the hub last closed", History: 1,
			Replicas: s.cfg.Replicas, TTL: maxCutAge,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("health: links bucket: %w", err)
	}
	lw, err := links.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("health: watch links bucket: %w", err)
	}
	defer func() { _ = lw.Stop() }()
	s.links.Store(&links)

	// Every replica knows every ballot.
	ballots, err := eventbus.NewConsumer(js, events.BallotFollower, func(ctx context.Context, ev eventbus.Event[*atollv1.Ballot]) error {
		if err := s.validBallot(ev.Msg, ev.Published); err != nil {
			return eventbus.Reject(err)
		}
		for _, n := range s.observeBallot(ctx, ev.Msg, ev.Published) {
			s.enqueue(ctx, n)
		}
		return nil
	}, eventbus.ConsumeOptions{Logger: s.log, Metrics: s.evm, Seen: s.ballotSeen})
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	s.ballots.Store(ballots)

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		for e := range lw.Updates() {
			if e == nil {
				s.linksReady.Store(true)
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, string(e.Value()))
			if err != nil {
				s.log.Warn("undecodable link loss", "key", e.Key(), "err", err)
				continue
			}
			s.LinkLost(ctx, e.Key(), at)
		}
	})
	wg.Go(func() {
		err := ballots.Run(ctx)
		if err != nil {
			s.log.Error("following ballots stopped", "err", err)
		}
	})

	t := time.NewTicker(s.cfg.Resync)
	defer t.Stop()
	for {
		// Unit states and holds computed from partial ballots could
		// release a hold or unprotect a node: wait for the catch-up.
		if s.Ready(ctx) == nil {
			s.resync(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// enqueue hands node to the reconciler's workqueue. On a replica that does
// not lead, there is no reconciler: the leader reconciles from its own
// state.
func (s *Service) enqueue(ctx context.Context, node string) {
	if !s.leads() {
		return
	}
	select {
	case s.work <- event.GenericEvent{Object: nodeRef(node)}:
	case <-ctx.Done():
	}
}

// resync re-evaluates every unit's disruption state and queues every lost
// node, so expiring votes and holds take effect without new events.
func (s *Service) resync(ctx context.Context) {
	// Read only: the cache's own objects, not 10,000 deep copies every
	// resync period.
	var list corev1.NodeList
	if err := s.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	now := s.now()
	// Expired votes no longer count: dropping them keeps the tracker to
	// the nodes voted about lately, however many came and went.
	s.tracker.Prune(now)
	_, tracked := s.tracker.Size()
	s.metrics.votes.Set(float64(tracked))
	byUnit := map[string][]*corev1.Node{}
	var queue []string
	for i := range list.Items {
		n := &list.Items[i]
		if unit := s.cfg.Units.Of(n); unit != "" {
			byUnit[unit] = append(byUnit[unit], n)
		}
		if ReadyStatus(n) == corev1.ConditionUnknown {
			queue = append(queue, n.Name)
		}
	}
	s.mu.RLock()
	for _, known := range []map[string]bool{keys(s.units), s.recorded} {
		for unit := range known {
			if _, ok := byUnit[unit]; !ok {
				byUnit[unit] = nil // unit vanished: back to Normal
			}
		}
	}
	s.mu.RUnlock()
	protected := 0
	for unit, members := range byUnit {
		names, changed := s.updateUnit(ctx, unit, now)
		if changed {
			queue = append(queue, names...)
		}
		for _, n := range members {
			if protect.LostByCloud(n) && Protect(n, s.tally(n, now), s.held(unit)) {
				protected++
			}
		}
	}
	s.metrics.protected.Set(float64(protected))
	if s.leads() {
		if err := s.syncProtected(ctx, byUnit, now); err != nil {
			s.log.Warn("protected set not written; retrying at the next resync", "err", err)
		}
	} else {
		var lost []*corev1.Node
		for i := range list.Items {
			if ReadyStatus(&list.Items[i]) == corev1.ConditionUnknown {
				lost = append(lost, &list.Items[i])
			}
		}
		s.repairs(ctx, lost, now)
	}
	s.resynced.Store(true)
	for _, n := range queue {
		s.enqueue(ctx, n)
	}
}

// updateUnit recomputes unit's disruption state and hold from its
// members in the cache (none: the unit vanished), records it, and tells
// the watchers of a new state. It returns the members' names and whether
// the state or the hold changed (their nodes need a reconcile). One unit
// is updated by one caller at a time (the resync, or an event that may
// move the state), each from the members as they are then: a caller
// holding an older list could otherwise undo a newer state.
func (s *Service) updateUnit(ctx context.Context, unit string, now time.Time) ([]string, bool) {
	mu, _ := s.unitLocks.LoadOrStore(unit, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	var list corev1.NodeList
	if err := s.cache.List(ctx, &list, client.MatchingFields{unitIndex: unit}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, false
	}
	members := make([]*corev1.Node, len(list.Items))
	for i := range list.Items {
		members[i] = &list.Items[i]
	}
	state, names, byName := s.disruption(ctx, members, now)
	st := unitStatus{state: state, nodes: names, ready: byName}
	if state != FullDisruption {
		st.rejoining = s.rejoining(ctx, unit, members, now)
		if !st.rejoining.IsZero() {
			st.state = FullDisruption
		}
	}
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
	watchers := s.watchers
	s.mu.Unlock()
	if len(members) == 0 {
		// A vanished unit's lock goes too, so the map stays the size of
		// the live units (a caller that still holds it is done with a
		// unit that no longer exists; a later one makes a new lock).
		s.unitLocks.Delete(unit)
	}
	if prev.state != st.state {
		for _, fn := range watchers {
			fn(unit, st.state)
		}
	}
	s.metrics.setUnitState(unit, st.state, len(members) == 0)
	changed := prev.state != st.state || !prev.holdUntil.Equal(st.holdUntil)
	if changed {
		s.log.Info("unit disruption", "unit", unit, "state", st.state, "was", prev.state, "hold_until", st.holdUntil)
	}
	if prev.rejoining.IsZero() != st.rejoining.IsZero() {
		if st.rejoining.IsZero() {
			s.log.Info("held unit rejoined: every lost member has its peers' verdict, or the rejoin grace ran out", "unit", unit, "state", state)
		} else {
			s.log.Info("held unit heard again: held until its lost members have their peers' verdicts", "unit", unit, "grace", s.cfg.RejoinGrace)
		}
	}
	return names, changed
}

// rejoining returns since when unit, held and now heard again (a ballot,
// a member Ready), is kept held: some member is still lost with no verdict
// of its peers (their ballots about it are on their way as the unit's
// agents reconnect one by one), and RejoinGrace has not passed since the
// unit was first heard. Zero: the hold ends. A member whose peers decided
// (healthy: protected by its verdict; unhealthy: left to Kubernetes), or
// that is Ready again, keeps the unit held no longer.
func (s *Service) rejoining(ctx context.Context, unit string, members []*corev1.Node, now time.Time) time.Time {
	s.mu.RLock()
	prev := s.units[unit]
	s.mu.RUnlock()
	if s.cfg.RejoinGrace <= 0 || prev.state != FullDisruption || !now.Before(prev.holdUntil) {
		return time.Time{}
	}
	since := prev.rejoining
	if since.IsZero() {
		since = now
	}
	if !now.Before(since.Add(s.cfg.RejoinGrace)) {
		return time.Time{}
	}
	for _, n := range members {
		if s.member(ctx, n, now).Lost() && s.tally(n, now).Verdict == atollv1.Verdict_VERDICT_NONE {
			return since
		}
	}
	return time.Time{}
}

// disruption classifies a unit of members at now (Disruption), and
// returns their names and Ready conditions.
func (s *Service) disruption(ctx context.Context, members []*corev1.Node, now time.Time) (UnitState, []string, map[string]corev1.ConditionStatus) {
	heard := make([]Member, 0, len(members))
	names := make([]string, 0, len(members))
	byName := make(map[string]corev1.ConditionStatus, len(members))
	quiet := 0
	for _, n := range members {
		m := s.member(ctx, n, now)
		heard, names = append(heard, m), append(names, n.Name)
		byName[n.Name] = m.Ready
		if m.Lost() || m.LinkDown {
			quiet++
		}
	}
	// Fresh votes matter only to a unit whose every member is lost or
	// silent (Disruption): tallying every member costs a walk of its
	// votes.
	fresh := false
	if quiet == len(members) {
		for _, n := range members {
			if fresh = s.heard(s.tally(n, now), now); fresh {
				break
			}
		}
	}
	return Disruption(heard, fresh), names, byName
}

// heard reports whether t has fresh votes, the newest of them stored by
// the hub less than UnheardAfter before now: the voters that cast them
// still reach the cloud.
func (s *Service) heard(t Tally, now time.Time) bool {
	return t.Votes() > 0 && (s.cfg.UnheardAfter <= 0 || now.Sub(t.LastVote) < s.cfg.UnheardAfter)
}

// member is what the cloud hears of node n at now: its Ready condition,
// whether its agent's link is down (and for SilentAfter already) or its
// agent unheard for UnheardAfter, and whether its kubelet's Lease is
// stale (not renewed for half its duration, or missing).
func (s *Service) member(ctx context.Context, n *corev1.Node, now time.Time) Member {
	m := Member{Ready: ReadyStatus(n), LeaseStale: true}
	if since, down := s.tracker.LinkDownSince(n.Name); down {
		m.LinkDown, m.Silent = true, now.Sub(since) >= s.cfg.SilentAfter
	} else if s.cfg.UnheardAfter > 0 {
		last := s.tracker.LastBallot(n.Name)
		if last.IsZero() {
			last = s.started
		}
		m.Unheard = now.Sub(last) >= s.cfg.UnheardAfter
	}
	var lease coordinationv1.Lease
	if err := s.cache.Get(ctx, types.NamespacedName{Namespace: corev1.NamespaceNodeLease, Name: n.Name}, &lease, client.UnsafeDisableDeepCopy); err == nil {
		m.LeaseStale = LeaseStale(&lease, now)
	}
	return m
}

// LeaseStale reports whether a kubelet's Lease was not renewed for half
// its duration at now: two renewals missed (the kubelet renews every
// quarter of it), before the node lifecycle controller's grace period
// runs out.
func LeaseStale(l *coordinationv1.Lease, now time.Time) bool {
	if l.Spec.RenewTime == nil {
		return true
	}
	d := 40 * time.Second // the kubelet's default
	if l.Spec.LeaseDurationSeconds != nil && *l.Spec.LeaseDurationSeconds > 0 {
		d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return now.Sub(l.Spec.RenewTime.Time) > d/2
}

// refreshUnit is updateUnit for one unit, from the cache, on the event
// paths that may move its state (a voter's link lost, the first vote of
// a silent unit, a member no longer Ready): the state and the verdicts
// of one transition then reach the reconciler together, so its nodes get
// one patch (the hold with the verdict annotations), not the verdicts at
// once and the hold at the next resync. On a change it queues every
// member, as the resync does. Nothing happens until the ballots have
// caught up and the resync has computed the states once.
func (s *Service) refreshUnit(ctx context.Context, unit string) {
	if unit == "" || !s.resynced.Load() || s.Ready(ctx) != nil {
		return
	}
	if names, changed := s.updateUnit(ctx, unit, s.now()); changed {
		for _, n := range names {
			s.enqueue(ctx, n)
		}
	}
}

// undecided reports whether the hub reported the leaf link of every
// member of unit closed while the unit is neither held (FullDisruption)
// nor AgentsSilent: the grace in which a site cut off is told from agents
// cut from the hub (its Leases go stale, or SilentAfter passes). Its
// nodes' verdict annotations wait: a hold may follow, and goes out with
// them.
func (s *Service) undecided(ctx context.Context, unit string) bool {
	if unit == "" {
		return false
	}
	if st, _ := s.UnitState(unit); st == FullDisruption || st == AgentsSilent {
		return false
	}
	var list corev1.NodeList
	if err := s.cache.List(ctx, &list, client.MatchingFields{unitIndex: unit}, client.UnsafeDisableDeepCopy); err != nil || len(list.Items) == 0 {
		return false
	}
	for i := range list.Items {
		if !s.tracker.LinkDown(list.Items[i].Name) {
			return false
		}
	}
	return true
}

// unitStale reports whether unit's state was computed with node Ready
// and node is no longer: the one Ready change that may make a unit silent
// (and held) at once. The others (a node found again, a new member) may
// only end a hold, which is not urgent: the resync sees them.
func (s *Service) unitStale(unit, node string, ready corev1.ConditionStatus) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.units[unit].ready[node]
	return ok && r == corev1.ConditionTrue && ready != corev1.ConditionTrue
}

// silentUnit reports whether unit is fully disrupted: a vote about one of
// its members may end that.
func (s *Service) silentUnit(unit string) bool {
	st, _ := s.UnitState(unit)
	return st == FullDisruption
}

func keys[V any](m map[string]V) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// holdSince returns since when unit is fully disrupted, recording now if
// no replica has yet: the first Create wins.
func (s *Service) holdSince(ctx context.Context, unit string, now time.Time) (time.Time, error) {
	if _, err := s.holds.Create(ctx, unit, []byte(now.UTC().Format(time.RFC3339Nano))); err == nil {
		s.mu.Lock()
		s.recorded[unit] = true
		s.mu.Unlock()
		return now, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return time.Time{}, err
	}
	e, err := s.holds.Get(ctx, unit)
	if err != nil {
		return time.Time{}, err
	}
	s.mu.Lock()
	s.recorded[unit] = true
	s.mu.Unlock()
	return time.Parse(time.RFC3339Nano, string(e.Value()))
}

func (s *Service) releaseHold(ctx context.Context, unit string) {
	s.mu.RLock()
	wasFull := s.units[unit].state == FullDisruption || s.recorded[unit]
	s.mu.RUnlock()
	if !wasFull {
		return
	}
	if err := s.holds.Delete(ctx, unit); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		s.log.Warn("cannot release the hold of a unit", "unit", unit, "err", err)
		return
	}
	s.mu.Lock()
	delete(s.recorded, unit)
	s.mu.Unlock()
}
