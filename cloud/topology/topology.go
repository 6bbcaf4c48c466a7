// Package topology is the cloud's view of the edge: it follows the edge
// agents' TopologyUpdates, groups nodes into units, and publishes to the
// edge what each node needs to join its unit: a NodeAssignment per node
// (unit and route credentials) and a UnitView per unit (members, their
// addresses and route URLs).
//
// Every replica computes the same views from the same events and publishes
// them with a content-derived message id, so replicas run active-active
// without electing a leader; JetStream drops the duplicates.
package topology

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// SecretsBucket is the KV bucket holding each unit's route credentials.
const SecretsBucket = "atoll_unit_routes"

// Membership sources.
const (
	// SourceKubernetes: units come from a label of the Kubernetes Nodes;
	// control-plane nodes are excluded. The default.
	SourceKubernetes = "kubernetes"
	// SourceDeclared: units come from the agents' own reports (for fabrics
	// without Kubernetes, and tests).
	SourceDeclared = "declared"
)

// Config tunes the topology service.
type Config struct {
	// Source of unit membership: SourceKubernetes or SourceDeclared.
	Source string
	// UnitLabel is the node label whose value names the node's unit.
	UnitLabel string
	// ExcludeLabels: nodes carrying any of these labels are cloud nodes,
	// in no unit and probed by nobody.
	ExcludeLabels []string
	// NodeTTL: a node that has not reported for this long is dropped
	// from its unit.
	NodeTTL time.Duration
	// Debounce coalesces bursts of updates into one publication.
	Debounce time.Duration
	// Replicas of the secrets bucket (match the hub's stream replicas).
	Replicas int
}

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		Source:        SourceKubernetes,
		UnitLabel:     wellknown.LabelUnit,
		ExcludeLabels: []string{"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master", wellknown.LabelCloud},
		NodeTTL:       10 * time.Minute,
		Debounce:      200 * time.Millisecond,
		Replicas:      1,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Source != SourceKubernetes && c.Source != SourceDeclared:
		return fmt.Errorf("topology: source %q: want %s or %s", c.Source, SourceKubernetes, SourceDeclared)
	case c.Source == SourceKubernetes && c.UnitLabel == "":
		return errors.New("topology: unit label is empty")
	case c.NodeTTL <= 0:
		return errors.New("topology: node TTL must be positive")
	case c.Debounce < 0:
		return errors.New("topology: debounce must not be negative")
	case c.Replicas < 1:
		return errors.New("topology: replicas must be at least 1")
	}
	return nil
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
	evm     *events.Metrics

	mu        sync.Mutex
	nodes     map[string]node
	published map[string]string // view subject → fingerprint
	units     map[string]bool   // units with a published view
	secrets   map[string]string // unit → route password
	kv        jetstream.KeyValue
	changed   chan struct{}
}

// New returns a topology service publishing through b (connected by the
// time Run is called). With SourceKubernetes, nodes lists the cluster's
// Nodes (and the caller pokes Changed on every Node event).
func New(cfg Config, b *hublink.Link, nodes corelisters.NodeLister, log *slog.Logger, m *metrics, evm *events.Metrics) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Source == SourceKubernetes && nodes == nil {
		return nil, errors.New("topology: the kubernetes source needs a node lister")
	}
	if m == nil {
		m = newMetrics(nil)
	}
	return &Service{
		cfg: cfg, bus: b, kube: nodes, log: log.With("component", "topology"), metrics: m, evm: evm,
		nodes:     map[string]node{},
		published: map[string]string{},
		units:     map[string]bool{},
		secrets:   map[string]string{},
		changed:   make(chan struct{}, 1),
	}, nil
}

// Run follows topology and publishes views until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	s.js = s.bus.JetStream()
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      SecretsBucket,
		Description: "Route credentials of each edge unit",
		History:     1,
		Replicas:    s.cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("topology: secrets bucket: %w", err)
	}
	s.kv = kv

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := events.Consume(ctx, s.js, events.TopologyFollower,
			func(_ context.Context, ev events.Event[*atollv1.TopologyUpdate]) error {
				s.observe(ev.Msg, ev.Published)
				return nil
			},
			events.ConsumeOptions{Logger: s.log, Metrics: s.evm})
		if err != nil {
			s.log.Error("following topology stopped", "err", err)
		}
	}()
	defer wg.Wait()

	expire := time.NewTicker(max(s.cfg.NodeTTL/10, time.Second))
	defer expire.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.changed:
		case <-expire.C:
		}
		if s.cfg.Debounce > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(s.cfg.Debounce):
			}
		}
		if err := s.publish(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("publishing views failed; will retry", "err", err)
			time.AfterFunc(time.Second, s.poke)
		}
	}
}

// Changed tells the service that the membership source changed.
func (s *Service) Changed() { s.poke() }

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
	s.nodes[u.GetNode()] = node{report: u, seen: seen}
	s.mu.Unlock()
	s.poke()
}

// member is one node as the membership source sees it.
type member struct {
	unit, ip string
	labels   map[string]string
	routeURL string
}

// membership returns every known edge node (unit "" for nodes in no unit).
// Callers hold mu.
func (s *Service) membership() map[string]member {
	out := map[string]member{}
	if s.cfg.Source == SourceDeclared {
		for name, n := range s.nodes {
			out[name] = member{unit: n.report.GetUnit(), ip: internalIP(n.report), labels: n.report.GetLabels(), routeURL: n.report.GetRouteUrl()}
		}
		return out
	}
	nodes, err := s.kube.List(labels.Everything())
	if err != nil {
		s.log.Error("cannot list nodes", "err", err)
		return out
	}
	for _, n := range nodes {
		if s.excluded(n) {
			continue
		}
		m := member{unit: n.Labels[s.cfg.UnitLabel], labels: n.Labels}
		if m.unit != "" {
			if err := events.ValidUnit(m.unit); err != nil {
				s.log.Warn("node in no unit: its unit label is not a valid unit name", "node", n.Name, "label", s.cfg.UnitLabel, "err", err)
				m.unit = ""
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				m.ip = a.Address
				break
			}
		}
		if r, ok := s.nodes[n.Name]; ok {
			m.routeURL = r.report.GetRouteUrl()
		}
		out[n.Name] = m
	}
	return out
}

func (s *Service) excluded(n *corev1.Node) bool {
	for _, l := range s.cfg.ExcludeLabels {
		if _, ok := n.Labels[l]; ok {
			return true
		}
	}
	return false
}

// publish computes every view and publishes those that changed.
func (s *Service) publish(ctx context.Context) error {
	now := time.Now()
	s.mu.Lock()
	for name, n := range s.nodes {
		if now.Sub(n.seen) > s.cfg.NodeTTL {
			s.log.Info("node stopped reporting; dropping it", "node", name, "unit", n.report.GetUnit(), "last_seen", n.seen)
			delete(s.nodes, name)
		}
	}
	members := map[string][]*atollv1.UnitMember{}
	assignments := map[string]string{} // node → unit
	for name, m := range s.membership() {
		assignments[name] = m.unit
		if m.unit == "" {
			continue
		}
		members[m.unit] = append(members[m.unit], &atollv1.UnitMember{
			Name:       name,
			InternalIp: m.ip,
			Labels:     m.labels,
			RouteUrl:   m.routeURL,
		})
	}
	// Agents that report but are not Nodes are told they are in no unit.
	for name := range s.nodes {
		if _, ok := assignments[name]; !ok {
			assignments[name] = ""
		}
	}
	units := maps.Clone(s.units)
	s.mu.Unlock()

	for unit := range members {
		units[unit] = true
	}
	s.metrics.nodes.Set(float64(len(assignments)))
	s.metrics.units.Set(float64(len(members)))

	for _, unit := range slices.Sorted(maps.Keys(units)) {
		ms := members[unit]
		slices.SortFunc(ms, func(a, b *atollv1.UnitMember) int { return strings.Compare(a.GetName(), b.GetName()) })
		view := &atollv1.UnitView{Unit: unit, Members: ms}
		subj, err := events.UnitViewSubject(unit)
		if err != nil {
			return err
		}
		if err := s.put(ctx, subj, view, func(fp string) { view.Fingerprint, view.Time = fp, timestamppb.New(now) }); err != nil {
			return err
		}
		s.mu.Lock()
		if len(ms) == 0 {
			delete(s.units, unit) // announced empty; forget it
		} else {
			s.units[unit] = true
		}
		s.mu.Unlock()
	}
	for _, name := range slices.Sorted(maps.Keys(assignments)) {
		a := &atollv1.NodeAssignment{Node: name, Unit: assignments[name]}
		if a.Unit != "" {
			pw, err := s.secret(ctx, a.Unit)
			if err != nil {
				return err
			}
			a.RouteUser, a.RoutePassword = "unit-"+a.Unit, pw
		}
		subj, err := events.AssignmentSubject(name)
		if err != nil {
			return err
		}
		if err := s.put(ctx, subj, a, func(fp string) { a.Fingerprint, a.Time = fp, timestamppb.New(now) }); err != nil {
			return err
		}
	}
	return nil
}

// put publishes m on subj unless the last published view there has the
// same content. stamp sets the fingerprint and time fields, which are left
// out of the fingerprint itself.
func (s *Service) put(ctx context.Context, subj string, m proto.Message, stamp func(fp string)) error {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("topology: encode %s: %w", subj, err)
	}
	sum := sha256.Sum256(b)
	fp := hex.EncodeToString(sum[:16])
	s.mu.Lock()
	last, known := s.published[subj]
	s.mu.Unlock()
	if !known {
		last = s.storedFingerprint(ctx, subj, m)
	}
	if last == fp {
		s.mu.Lock()
		s.published[subj] = fp
		s.mu.Unlock()
		return nil
	}
	stamp(fp)
	if _, err := events.PublishDurable(ctx, s.js, subj, m, subj+"@"+fp); err != nil {
		return err
	}
	s.mu.Lock()
	s.published[subj] = fp
	s.mu.Unlock()
	s.metrics.published.Inc()
	s.log.Debug("view published", "subject", subj, "fingerprint", fp)
	return nil
}

// storedFingerprint is the fingerprint of the view last stored on subj, so
// a restarted replica does not republish what is already there.
func (s *Service) storedFingerprint(ctx context.Context, subj string, like proto.Message) string {
	st, err := s.js.Stream(ctx, events.StreamViews)
	if err != nil {
		return ""
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return ""
	}
	m := like.ProtoReflect().New().Interface()
	if err := proto.Unmarshal(raw.Data, m); err != nil {
		return ""
	}
	type fingerprinted interface{ GetFingerprint() string }
	if f, ok := m.(fingerprinted); ok {
		return f.GetFingerprint()
	}
	return ""
}

// secret returns unit's route password, creating it once for all
// replicas: the first Create wins, everyone else reads it back.
func (s *Service) secret(ctx context.Context, unit string) (string, error) {
	s.mu.Lock()
	pw, ok := s.secrets[unit]
	s.mu.Unlock()
	if ok {
		return pw, nil
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	pw = hex.EncodeToString(raw[:])
	if _, err := s.kv.Create(ctx, unit, []byte(pw)); err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("topology: route secret of %s: %w", unit, err)
		}
		e, err := s.kv.Get(ctx, unit)
		if err != nil {
			return "", fmt.Errorf("topology: route secret of %s: %w", unit, err)
		}
		pw = string(e.Value())
	}
	s.mu.Lock()
	s.secrets[unit] = pw
	s.mu.Unlock()
	return pw, nil
}

func internalIP(u *atollv1.TopologyUpdate) string {
	for _, a := range u.GetAddresses() {
		if a.GetType() == "InternalIP" {
			return a.GetAddress()
		}
	}
	return ""
}
