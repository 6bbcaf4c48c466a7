// Package members is the cloud's view of the edge: it follows the edge
// agents' TopologyUpdates, groups nodes into units, and publishes to the
// edge what each node needs to join its unit: a NodeAssignment per node
// (unit and route credentials, rotated when a member leaves: routes.go)
// and a UnitView per unit (members, their addresses, route URLs and
// identity keys).
//
// Every replica computes the same views from the same events and publishes
// a view only when the stream's last value for its subject differs, with a
// message id made of its content and the value it replaces
// (eventbus.LastValue, see put), so replicas run active-active without
// electing a leader: JetStream drops the duplicates, yet a view that
// returns to earlier content is stored.
// Each view and assignment is published on its own, and a periodic resync
// compares every one with the stream and repairs what is missing.
package members

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// EdgeGate lets edges onto the hub or keeps them off: the identity
// service (cloud/identity.Service, revocation in the account JWT, on
// either hub shape) implements it.
type EdgeGate interface {
	// Suspend refuses node's connections and closes its live link.
	Suspend(node string)
	// Resume lets node connect again.
	Resume(node string)
}

// NodeKeys tells the service each edge node's identity key (its nkey user
// public key), which it publishes in the node's unit view so that peers
// can verify what the node signs (events.Verify). The identity service
// (cloud/identity.Service) implements it.
type NodeKeys interface {
	// NodeKey returns node's nkey user public key ("U...").
	NodeKey(node string) (pub string, ok bool)
	// NotifyKeys has f called after a node's key is added, replaced or
	// removed; f must not block.
	NotifyKeys(f func())
}

// node is what the service knows of one edge node.
type node struct {
	report *atollv1.TopologyUpdate
	seen   time.Time
}

// Service follows topology and publishes views.
type Service struct {
	cfg     Config
	bus     *hublink.Link
	kube    corelisters.NodeLister // nil with SourceDeclared
	js      jetstream.JetStream
	log     *slog.Logger
	metrics *metrics
	evm     *eventbus.Metrics

	mu        sync.Mutex
	nodes     map[string]node
	believed  map[string]eventbus.Stored // what views and assignments held before the last resync
	units     map[string]bool            // units with a published view
	assigned  map[string]string          // node → unit, as last published
	rejected  map[string]string          // "node/field" → the input rejected, logged once
	oversized map[string]int             // unit → size of its view, rejected and logged once
	gate      EdgeGate                   // nil: nobody to tell of deleted Nodes
	kubeNodes map[string]bool            // Kubernetes Nodes in the last listing
	listed    map[string]bool            // the listing before, to find deleted Nodes
	resync    bool                       // the next pass compares every view with the stream
	kv        jetstream.KeyValue
	changed   chan struct{}

	// The unit views and node assignments, as stored (publish.go).
	unitViews   *eventbus.LastValue[*atollv1.UnitView]
	assignments *eventbus.LastValue[*atollv1.NodeAssignment]

	secrets map[string]cachedSecret // unit → its route secret (routes.go), as last read or written; under mu
	keys    NodeKeys                // nil: members are published without keys

	unitEvents     *unitEvents // unitevents.go
	unitEventsOnce sync.Once

	// The recompute path (incremental.go): dirty holds the nodes whose
	// inputs changed since the last pass (a Node event, a topology
	// report); unitMembers indexes the members of each unit as last
	// published. A pass recomputes only the dirty nodes' assignments and
	// their units' views, unless full is set (start, resync, a key or
	// source change without a node, a failed pass), when it recomputes
	// everything. Under mu.
	dirty       map[string]bool
	full        bool
	unitMembers map[string]map[string]bool
}

// New returns a topology service publishing through b (connected by the
// time Run is called). With SourceKubernetes, nodes lists the cluster's
// Nodes (and the caller pokes Changed on every Node event).
func New(cfg Config, b *hublink.Link, nodes corelisters.NodeLister, log *slog.Logger, m *metrics, evm *eventbus.Metrics) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Source == SourceKubernetes && nodes == nil {
		return nil, errors.New("members: the kubernetes source needs a node lister")
	}
	if m == nil {
		m = newMetrics(nil)
	}
	s := &Service{
		cfg: cfg, bus: b, kube: nodes, log: log.With("component", "members"), metrics: m, evm: evm,
		nodes:     map[string]node{},
		units:     map[string]bool{},
		assigned:  map[string]string{},
		secrets:   map[string]cachedSecret{},
		rejected:  map[string]string{},
		oversized: map[string]int{},
		changed:   make(chan struct{}, 1),
		dirty:     map[string]bool{},
		full:      true,
	}
	s.unitViews, s.assignments = lastValues(s)
	return s, nil
}

// open binds the service to the hub's JetStream and its secrets bucket.
func (s *Service) open(ctx context.Context) error {
	s.js = s.bus.JetStream()
	var kv jetstream.KeyValue
	err := eventbus.UntilSet(ctx, func(ctx context.Context) (err error) {
		kv, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      SecretsBucket,
			Description: "Route credentials of each edge unit",
			History:     1,
			Replicas:    s.cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("members: secrets bucket: %w", err)
	}
	s.kv = kv
	return nil
}

// Run follows topology and publishes views until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	if err := s.open(ctx); err != nil {
		return err
	}

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := eventbus.Consume(ctx, s.js, events.TopologyFollower,
			func(_ context.Context, ev eventbus.Event[*atollv1.TopologyUpdate]) error {
				s.observe(ev.Msg, ev.Published)
				return nil
			},
			eventbus.ConsumeOptions{Logger: s.log, Metrics: s.evm})
		if err != nil {
			s.log.Error("following topology stopped", "err", err)
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchSecrets(ctx)
	}()
	defer wg.Wait()

	// A reconnect may land on a hub that lost views (a restarted server,
	// a store rebuilt from peers): RunPasses resyncs at once rather than
	// at the next tick.
	return s.bus.RunPasses(ctx, hublink.Passes{
		Name: "member views", Changed: s.changed, Log: s.log,
		Resync: s.cfg.Resync, OnResync: s.requestResync,
		Tick: max(s.cfg.NodeTTL/10, time.Second), OnTick: func() { s.expireNodes(time.Now()) },
		Debounce: s.cfg.Debounce,
		Pass: func(ctx context.Context) error {
			// Each failed view was logged and counted; the others are
			// out. Rejected inputs wait for a change instead.
			if err := s.pass(ctx); errors.Is(err, errRetry) {
				return err
			}
			return nil
		},
	})
}

// SetEdgeGate has the service suspend the hub link of an edge whose
// Kubernetes Node is deleted, and resume it when the Node is back (a
// kubelet registers its Node again). Only Nodes seen and then deleted are
// suspended: an enrolled edge whose Node is not registered yet may
// connect. Call it before Run.
func (s *Service) SetEdgeGate(g EdgeGate) { s.gate = g }

// SetNodeKeys has the service publish each member's identity key from
// keys in its unit view, and republish the views when a key changes. A
// member whose key keys does not know is published without one, and its
// peers then drop its probe reports. Call it before Run.
func (s *Service) SetNodeKeys(keys NodeKeys) {
	s.keys = keys
	keys.NotifyKeys(s.Changed)
}

func (s *Service) requestResync() {
	s.mu.Lock()
	s.resync, s.full = true, true
	s.mu.Unlock()
}

// Changed tells the service that the membership source changed, without
// saying where: the next pass recomputes every view.
func (s *Service) Changed() {
	s.mu.Lock()
	s.full = true
	s.mu.Unlock()
	s.poke()
}

// NodeChanged tells the service that the Node name changed (or was
// deleted): the next pass recomputes only its assignment and the views of
// the units it left and joined.
func (s *Service) NodeChanged(name string) {
	s.mu.Lock()
	s.dirty[name] = true
	s.mu.Unlock()
	s.poke()
}

func (s *Service) poke() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// observe records one TopologyUpdate.
func (s *Service) observe(u *atollv1.TopologyUpdate, published time.Time) {
	if unit := u.GetUnit(); unit != "" {
		if err := events.ValidUnit(unit); err != nil {
			s.log.Warn("ignoring topology update with invalid unit", "node", u.GetNode(), "err", err)
			return
		}
	}
	seen := published
	if seen.IsZero() {
		seen = time.Now()
	}
	s.mu.Lock()
	prev, had := s.nodes[u.GetNode()]
	s.nodes[u.GetNode()] = node{report: u, seen: seen}
	// A report that repeats what the views take from it (each agent
	// reports every 30 s) marks nothing: a pass for it rebuilt its unit's
	// view and every member's assignment to store nothing, O(unit) per
	// report.
	dirty := !had || !sameMembership(prev.report, u)
	if dirty {
		s.dirty[u.GetNode()] = true
	}
	s.mu.Unlock()
	if dirty {
		s.poke()
	}
}

// sameMembership reports whether two reports of a node say the same of
// what the views take from a report: its unit, InternalIP, labels and
// route URL.
func sameMembership(a, b *atollv1.TopologyUpdate) bool {
	return a.GetUnit() == b.GetUnit() && a.GetRouteUrl() == b.GetRouteUrl() &&
		internalIP(a) == internalIP(b) && maps.Equal(a.GetLabels(), b.GetLabels())
}

// member is one node as the membership source sees it.
type member struct {
	unit, ip string
	labels   map[string]string
	routeURL string
	key      string // node identity key, from NodeKeys
}

// membership returns every known edge node (unit "" for nodes in no unit).
// Callers hold mu.
func (s *Service) membership() map[string]member {
	out := map[string]member{}
	if s.cfg.Source == SourceDeclared {
		for name, n := range s.nodes {
			out[name] = s.checked(name, member{unit: n.report.GetUnit(), ip: internalIP(n.report), labels: n.report.GetLabels(), routeURL: n.report.GetRouteUrl(), key: s.nodeKey(name)})
		}
		return out
	}
	nodes, err := s.kube.List(labels.Everything())
	if err != nil {
		s.log.Error("cannot list nodes", "err", err)
		return out
	}
	s.kubeNodes = make(map[string]bool, len(nodes))
	for _, n := range nodes {
		s.kubeNodes[n.Name] = true
	}
	for _, n := range nodes {
		if s.excluded(n) {
			continue
		}
		m := s.kubeMember(n)
		out[n.Name] = s.checked(n.Name, m)
	}
	return out
}

// checked drops from m the fields that fail validation, so one node's bad
// report costs only that field (its peers do not route to it) and never
// the view of its unit. Each rejected value is logged and counted once.
// Callers hold mu.
func (s *Service) checked(name string, m member) member {
	check := func(field, reason, value string, valid func(string) error) string {
		key := name + "/" + field
		if value == "" {
			delete(s.rejected, key)
			return ""
		}
		err := valid(value)
		if err == nil {
			delete(s.rejected, key)
			return value
		}
		if s.rejected[key] != value {
			s.rejected[key] = value
			s.metrics.rejected.WithLabelValues(reason).Inc()
			shown := value
			if len(shown) > 80 {
				shown = shown[:80] + "…"
			}
			s.log.Warn("node input rejected; the field is left out of its unit view", "node", name, "unit", m.unit, "field", field, "value", shown, "err", err)
		}
		return ""
	}
	m.routeURL = check("route_url", reasonRouteURL, m.routeURL, checkRouteURL)
	m.ip = check("internal_ip", reasonInternalIP, m.ip, checkIP)
	m.key = check("node_key", reasonNodeKey, m.key, checkNodeKey)
	return m
}

// nodeKey is node's identity key, "" when none is known.
func (s *Service) nodeKey(node string) string {
	if s.keys == nil {
		return ""
	}
	pub, _ := s.keys.NodeKey(node)
	return pub
}

func (s *Service) excluded(n *corev1.Node) bool { return s.cfg.Units.Excluded(n.Labels) }

// publish computes every view and publishes those that differ from what
// the stream holds. Each view and each assignment is published on its own:
// one that cannot be (too large, a failed publish, no route secret) is
// logged and counted, and the others still go out. The error joins the
// failures; those marked errRetry (not a rejected input) are retried by
// Run.
func (s *Service) publish(ctx context.Context) error {
	now := time.Now()
	s.mu.Lock()
	if s.resync {
		// Forget what was published: every put below compares with the
		// stream's last stored value of its subject.
		s.resync = false
		s.believed = s.unitViews.ForgetAll()
		maps.Copy(s.believed, s.assignments.ForgetAll())
	}
	for name, n := range s.nodes {
		if now.Sub(n.seen) > s.cfg.NodeTTL {
			s.log.Info("node stopped reporting; dropping it", "node", name, "unit", n.report.GetUnit(), "last_seen", n.seen)
			delete(s.nodes, name)
		}
	}
	members := map[string][]*atollv1.UnitMember{}
	assignments := map[string]string{} // node → unit
	names := map[string][]string{}     // unit → its members' names
	for name, m := range s.membership() {
		assignments[name] = m.unit
		if m.unit == "" {
			continue
		}
		names[m.unit] = append(names[m.unit], name)
		members[m.unit] = append(members[m.unit], &atollv1.UnitMember{
			Name:       name,
			InternalIp: m.ip,
			Labels:     m.labels,
			RouteUrl:   m.routeURL,
			NodeKey:    m.key,
		})
	}
	// Agents that report but are not Nodes are told they are in no unit.
	for name := range s.nodes {
		if _, ok := assignments[name]; !ok {
			assignments[name] = ""
		}
	}
	for key := range s.rejected {
		if node, _, _ := strings.Cut(key, "/"); !hasKey(assignments, node) {
			delete(s.rejected, key) // the node is gone
		}
	}
	units := maps.Clone(s.units)
	s.assigned = maps.Clone(assignments)
	s.unitMembers = make(map[string]map[string]bool, len(names))
	for unit, ns := range names {
		set := make(map[string]bool, len(ns))
		for _, n := range ns {
			set[n] = true
		}
		s.unitMembers[unit] = set
	}
	var deleted, back []string
	if s.gate != nil && s.kubeNodes != nil {
		for name := range s.listed {
			if !s.kubeNodes[name] {
				deleted = append(deleted, name)
			}
		}
		for name := range s.kubeNodes {
			if s.listed != nil && !s.listed[name] {
				back = append(back, name)
			}
		}
		s.listed = s.kubeNodes
	}
	s.mu.Unlock()

	for _, name := range deleted {
		s.log.Info("node deleted; closing its hub link and refusing it until the node is back", "node", name)
		s.gate.Suspend(name)
	}
	for _, name := range back {
		s.gate.Resume(name)
	}

	for unit := range members {
		units[unit] = true
		slices.Sort(names[unit])
	}
	unitEventsErr := s.publishUnitEvents(ctx, units, names, true)
	s.metrics.nodes.Set(float64(len(assignments)))
	s.metrics.units.Set(float64(len(members)))

	errs := []error{unitEventsErr}
	fail := s.failer(ctx, &errs)
	for _, unit := range slices.Sorted(maps.Keys(units)) {
		if err := s.publishUnit(ctx, unit, members[unit], now, fail); err != nil {
			errs = append(errs, err)
		}
	}
	secrets := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(assignments)) {
		s.publishAssignment(ctx, name, assignments[name], names[assignments[name]], secrets, now, fail)
	}
	return errors.Join(errs...)
}

// failer returns the function that logs, counts and collects into errs a
// view that could not be published.
func (s *Service) failer(ctx context.Context, errs *[]error) func(reason, what string, err error) {
	return func(reason, what string, err error) {
		s.metrics.rejected.WithLabelValues(reason).Inc()
		if ctx.Err() == nil {
			s.log.Warn("view not published; the others are", "view", what, "reason", reason, "err", err)
		}
		*errs = append(*errs, fmt.Errorf("%w: %w", errRetry, err))
	}
}

// publishUnit publishes unit's view of members ms (sorted here); an empty
// view is published once and the unit then forgotten.
// It returns the error of a view rejected as too large (not retried: it
// waits for a change); publish failures go to fail.
func (s *Service) publishUnit(ctx context.Context, unit string, ms []*atollv1.UnitMember, now time.Time, fail func(reason, what string, err error)) error {
	slices.SortFunc(ms, func(a, b *atollv1.UnitMember) int { return strings.Compare(a.GetName(), b.GetName()) })
	view := &atollv1.UnitView{Unit: unit, Members: ms}
	subj, err := events.UnitViewSubject(unit)
	if err != nil {
		fail(reasonPublish, "unit "+unit, err)
		return nil
	}
	if size := proto.Size(view); size > s.cfg.MaxViewBytes {
		err := fmt.Errorf("members: view of unit %s: %d bytes, more than the maximum %d", unit, size, s.cfg.MaxViewBytes)
		if s.oversized[unit] != size { // only the publishing goroutine uses oversized
			s.oversized[unit] = size
			s.metrics.rejected.WithLabelValues(reasonTooLarge).Inc()
			s.log.Warn("view rejected; the others are published", "unit", unit, "reason", reasonTooLarge, "err", err)
		}
		return err
	}
	delete(s.oversized, unit)
	if err := put(ctx, s, s.unitViews, subj, view, func(fp string) { view.Fingerprint, view.Time = fp, timestamppb.New(now) }); err != nil {
		fail(reasonPublish, "unit "+unit, err)
		return nil
	}
	s.mu.Lock()
	if len(ms) == 0 {
		delete(s.units, unit) // announced empty; forget it
	} else {
		s.units[unit] = true
	}
	s.mu.Unlock()
	return nil
}

// publishAssignment publishes node name's assignment to unit ("" for
// none), whose members are names (sorted), with the unit's route secret.
// secrets holds the secrets read so far in the pass, by unit: every
// member's assignment carries its unit's, and reading it per member would
// compare the unit's member lists once per member (O(unit² log unit) a
// pass).
func (s *Service) publishAssignment(ctx context.Context, name, unit string, names []string, secrets map[string]string, now time.Time, fail func(reason, what string, err error)) {
	a := &atollv1.NodeAssignment{Node: name, Unit: unit}
	if a.Unit != "" {
		pw, ok := secrets[a.Unit]
		if !ok {
			var err error
			if pw, err = s.secret(ctx, a.Unit, names); err != nil {
				fail(reasonSecret, "assignment of "+name, err)
				return
			}
			secrets[a.Unit] = pw
		}
		a.RouteUser, a.RoutePassword = routeUser(a.Unit), pw
	}
	subj, err := events.AssignmentSubject(name)
	if err != nil {
		fail(reasonPublish, "assignment of "+name, err)
		return
	}
	if err := put(ctx, s, s.assignments, subj, a, func(fp string) { a.Fingerprint, a.Time = fp, timestamppb.New(now) }); err != nil {
		fail(reasonPublish, "assignment of "+name, err)
	}
}

// reportGrace is how long after a view was stored an agent's report may
// still show the previous one without the agent counting as behind.
const reportGrace = 2 * time.Second

// Views behind, as ViewsBehind names them.
const (
	BehindAssignment = "assignment"
	BehindUnitView   = "unit view"
	BehindUnknown    = "unknown"
)

// ViewsBehind names the views node's agent holds older than the ones this
// service published, by the fingerprints in the agent's last topology
// report: BehindAssignment, BehindUnitView or both joined by ", "; empty
// when it holds the current ones (or reported before they were stored);
// BehindUnknown when the agent has not reported, or reports no
// fingerprints (it holds no views yet).
func (s *Service) ViewsBehind(node string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[node]
	if !ok || (n.report.GetAssignmentFingerprint() == "" && n.report.GetUnitViewFingerprint() == "") {
		return BehindUnknown
	}
	var behind []string
	check := func(what, subj, held string, known func(string) (eventbus.Stored, bool)) {
		st, ok := known(subj)
		if ok && st.Fingerprint != held && n.seen.After(st.Time.Add(reportGrace)) {
			behind = append(behind, what)
		}
	}
	if subj, err := events.AssignmentSubject(node); err == nil {
		check(BehindAssignment, subj, n.report.GetAssignmentFingerprint(), s.assignments.Known)
	}
	if unit := s.assigned[node]; unit != "" {
		if subj, err := events.UnitViewSubject(unit); err == nil {
			check(BehindUnitView, subj, n.report.GetUnitViewFingerprint(), s.unitViews.Known)
		}
	}
	return strings.Join(behind, ", ")
}

// ProbeRefusals are the refusals of node's probe credentials by its
// peers, from its agent's last topology report: a configuration error of
// the agent's kubelet token while any is reported. Nil when none is, or
// the agent has not reported.
func (s *Service) ProbeRefusals(node string) []*atollv1.ProbeRefusal {
	s.mu.Lock()
	n, ok := s.nodes[node]
	s.mu.Unlock()
	if !ok || len(n.report.GetProbeRefusals()) == 0 {
		return nil
	}
	out := make([]*atollv1.ProbeRefusal, 0, len(n.report.GetProbeRefusals()))
	for _, r := range n.report.GetProbeRefusals() {
		out = append(out, proto.CloneOf(r))
	}
	return out
}

func internalIP(u *atollv1.TopologyUpdate) string {
	for _, a := range u.GetAddresses() {
		if a.GetType() == "InternalIP" {
			return a.GetAddress()
		}
	}
	return ""
}

func hasKey[V any](m map[string]V, k string) bool { _, ok := m[k]; return ok }
