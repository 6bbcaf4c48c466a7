// Package objects publishes the cloud's views of Services,
// EndpointSlices, Endpoints and Nodes on the hub's VIEWS stream, for the
// edge proxies that serve them to kube-proxy (edge/proxy).
//
// The views every unit reads are stored once, in the shared view space
// (atoll.view._all.<kind>.<namespace>.<name>, events.SharedSpace):
// every Service, EndpointSlice and Endpoints. The topology filter runs at
// the edge, where the host's own labels decide; the labels it compares
// them with travel in the endpoints' own views: the view of an
// EndpointSlice or Endpoints whose Service has topology keys carries each
// endpoint node's values of those keys (wellknown.EndpointTopologyAnnotation),
// so no edge needs every Node of the cluster. A unit's Nodes are
// published in full in its own space only (atoll.view.<unit>.nodes._.<name>;
// kube-proxy reads its own Node). One object change is one message (two
// for a Node that moved unit: a tombstone in the old unit); a Node whose
// labels changed also republishes the views of the slices and Endpoints
// with endpoints on it, each stored only if its topology changed. A
// deleted object leaves a tombstone (ObjectView.deleted).
//
// Each view is stored with eventbus.LastValue: published only when the
// stream's last value for its subject has another fingerprint, under the
// message id <subject>@<fingerprint>@<sequence it replaces> and expecting
// that last subject sequence, so replicas run active-active and a resync
// republishes nothing that did not change.
package objects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// key names one Kubernetes object.
type key struct{ kind, namespace, name string }

// Publisher publishes the object views.
type Publisher struct {
	cfg     Config
	reader  client.Reader
	bus     *hublink.Link
	log     *slog.Logger
	metrics *metrics

	js     jetstream.JetStream
	stream jetstream.Stream                         // VIEWS, for its subjects (tombstoneStale)
	views  *eventbus.LastValue[*atollv1.ObjectView] // each subject's view, as stored

	mu       sync.Mutex
	dirty    map[key]bool
	all      bool              // the next pass handles every object
	unitSize map[string]int    // unit → its Nodes, as of the last pass (refreshUnits; nil before the first)
	nodeUnit map[string]string // node → unit, as of the last pass
	uids     map[key]string    // uid of each object last seen, for its tombstone
	// The views that carry a node's topology, to republish when its
	// labels change; only pass and what it calls touch them.
	byNode  map[string]map[key]struct{}  // node → slices and Endpoints with endpoints on it (those whose Service has topology keys)
	nodesOf map[key][]string             // slice or Endpoints → the nodes it is in byNode under
	labels  map[string]map[string]string // node in byNode → its labels as of the last pass that read it
	broken  map[key]map[string]bool      // objects whose stored view cannot be served → the spaces it is in (checkStored)
	changed chan struct{}
}

// New returns a publisher reading the cluster through reader (the
// manager's cache) and publishing through b, each view signed by signer
// when it is not nil.
func New(cfg Config, reader client.Reader, b *hublink.Link, log *slog.Logger, m *metrics, signer events.Signer) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if reader == nil {
		return nil, errors.New("objects: no Kubernetes reader")
	}
	if m == nil {
		m = newMetrics(nil)
	}
	return &Publisher{
		cfg: cfg, reader: reader, bus: b, log: log.With("component", "objectviews"), metrics: m,
		dirty: map[key]bool{}, all: true, nodeUnit: map[string]string{},
		views: eventbus.NewLastValue(b.JetStream, events.StreamViews, eventbus.LastValueOptions[*atollv1.ObjectView]{
			Stamp: func(v *atollv1.ObjectView) *atollv1.ObjectView {
				m := proto.Clone(v).(*atollv1.ObjectView)
				m.Time = timestamppb.Now()
				return m
			},
			// A tombstone is not stored where nothing was.
			Empty:  (*atollv1.ObjectView).GetDeleted,
			Signer: signer,
		}),
		uids:   map[key]string{},
		byNode: map[string]map[key]struct{}{}, nodesOf: map[key][]string{}, labels: map[string]map[string]string{},
		broken:  map[key]map[string]bool{},
		changed: make(chan struct{}, 1),
	}, nil
}

// Changed tells the publisher that one object changed (or was deleted).
func (p *Publisher) Changed(kind, namespace, name string) {
	p.mu.Lock()
	p.dirty[key{kind, namespace, name}] = true
	p.mu.Unlock()
	p.poke()
}

// Resync has the next pass compare every view with the stream.
func (p *Publisher) Resync() {
	p.forgetAll()
	p.poke()
}

// forgetAll has the next pass compare every view with the stream.
func (p *Publisher) forgetAll() {
	p.mu.Lock()
	p.all = true
	p.mu.Unlock()
	p.views.ForgetAll()
}

func (p *Publisher) poke() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Run publishes until ctx is done.
func (p *Publisher) Run(ctx context.Context) error {
	p.js = p.bus.JetStream()
	if nc := p.bus.Conn(); nc != nil {
		// The views as stored, republished by the hub: one that cannot
		// be served is repaired at once (checkStored).
		var subs []*nats.Subscription
		for _, kind := range objectview.Kinds {
			subj, err := events.Republished(strings.TrimSuffix(events.ViewSubjects, ">") + "*." + kind + ".>")
			if err != nil {
				return err
			}
			sub, err := nc.Subscribe(subj, p.checkStored)
			if err != nil {
				return fmt.Errorf("objects: subscribe %s: %w", subj, err)
			}
			subs = append(subs, sub)
		}
		defer func() {
			for _, sub := range subs {
				_ = sub.Unsubscribe()
			}
		}()
	}
	return p.bus.RunPasses(ctx, hublink.Passes{
		Name: "object views", Changed: p.changed, Log: p.log,
		Resync: p.cfg.Resync, OnResync: p.forgetAll,
		Debounce: p.cfg.Debounce, Pass: p.pass,
	})
}

// checkStored looks at a view as the stream stored it (its republished
// copy): one that an edge cannot serve (it does not decode, names
// another kind, or carries a topology that does not decode) hides the
// object from every edge that has no good copy of it yet, until the next
// resync. The publisher owns the subject: it reads its own state again
// and stores the right view (or a tombstone) at the next pass. Every
// replica does it; the message id makes it one message.
func (p *Publisher) checkStored(msg *nats.Msg) {
	subj := strings.Replace(msg.Subject, strings.TrimSuffix(events.ViewRepublishSubjects, ">"), strings.TrimSuffix(events.ViewSubjects, ">"), 1)
	vk, err := events.ParseViewSubject(subj)
	if err != nil {
		return
	}
	bad := servable(vk.Kind, msg.Data)
	if bad == nil {
		return
	}
	p.metrics.repaired.WithLabelValues(vk.Kind).Inc()
	p.log.Warn("a stored view cannot be served; storing the right one", "subject", subj, "err", bad)
	k := key{vk.Kind, vk.Namespace, vk.Name}
	if vk.Namespace == events.ClusterScoped {
		k.namespace = ""
	}
	p.views.Forget(subj)
	p.mu.Lock()
	p.dirty[k] = true
	if p.broken[k] == nil {
		p.broken[k] = map[string]bool{}
	}
	p.broken[k][vk.Unit] = true
	p.mu.Unlock()
	p.poke()
}

// servable says why a stored view of kind cannot be served (nil: it can).
func servable(kind string, data []byte) error {
	var v atollv1.ObjectView
	if err := proto.Unmarshal(data, &v); err != nil {
		return fmt.Errorf("it does not decode: %w", err)
	}
	if v.GetKind() != kind {
		return fmt.Errorf("it is of kind %q", v.GetKind())
	}
	if v.GetDeleted() {
		return nil
	}
	obj, err := objectview.Decode(&v)
	if err != nil {
		return err
	}
	if kind == objectview.KindEndpointSlices || kind == objectview.KindEndpoints {
		if _, err := objectview.DecodeEndpointTopology(obj); err != nil {
			return err
		}
	}
	return nil
}

// pass publishes the views of the changed objects, or of every object
// when the unit set changed or a resync asked for it.
func (p *Publisher) pass(ctx context.Context) error {
	p.mu.Lock()
	all := p.all
	dirty, broken := p.dirty, p.broken
	p.dirty, p.all, p.broken = map[key]bool{}, false, map[key]map[string]bool{}
	p.mu.Unlock()
	// What a pass does not repair is left for the next one (requeue marks
	// the objects; a repaired one leaves broken below).
	defer func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		for k, spaces := range broken {
			if p.broken[k] == nil {
				p.broken[k] = map[string]bool{}
			}
			maps.Copy(p.broken[k], spaces)
		}
	}()
	// A node that changed units changes its own view in both.
	prevUnit, unitsChanged, err := p.refreshUnits(ctx, dirty, all)
	if err != nil {
		p.requeue(dirty, all)
		return err
	}
	all = all || unitsChanged
	nodeUnit := p.nodeUnit

	var keys []key
	if all {
		var err error
		if keys, err = p.allKeys(ctx); err != nil {
			p.requeue(dirty, true)
			return err
		}
		for k := range dirty {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	} else {
		keys = slices.Collect(maps.Keys(dirty))
	}
	if keys, err = p.dependents(ctx, keys, all); err != nil {
		p.requeue(dirty, all)
		return err
	}
	unitList := slices.Sorted(maps.Keys(p.unitSize))
	p.metrics.units.Set(float64(len(unitList)))
	var failed []error
	retry := map[key]bool{}
	for _, k := range keys {
		if err := p.publishObject(ctx, k, nodeUnit, prevUnit, broken[k]); err != nil {
			failed = append(failed, err)
			retry[k] = true
		} else {
			delete(broken, k)
		}
	}
	if all {
		if err := p.tombstoneStale(ctx, keys, unitList); err != nil {
			failed = append(failed, err)
		}
	}
	p.metrics.passes.Inc()
	if len(failed) > 0 {
		p.requeue(retry, false)
		return errors.Join(failed...)
	}
	return nil
}

func (p *Publisher) requeue(keys map[key]bool, all bool) {
	p.mu.Lock()
	for k := range keys {
		p.dirty[k] = true
	}
	p.all = p.all || all
	p.mu.Unlock()
}

// refreshUnits brings nodeUnit and unitSize up to date for a pass and
// returns the units the pass's nodes were in before it (prevUnit) and
// whether the set of units changed. A full pass (and the first) reads
// every Node; any other reads only the Nodes dirty marks, so that a pass
// after a Node's status update costs that Node, not all of them: Nodes
// change all the time in a large cluster. Only pass
// calls it, and only pass and what it calls read nodeUnit and unitSize.
func (p *Publisher) refreshUnits(ctx context.Context, dirty map[key]bool, full bool) (map[string]string, bool, error) {
	if full || p.unitSize == nil {
		// The cache's own Nodes, not copies: only names and labels are
		// read.
		var nodes corev1.NodeList
		if err := p.reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
			return nil, false, fmt.Errorf("objects: list nodes: %w", err)
		}
		nodeUnit, size := map[string]string{}, map[string]int{}
		for i := range nodes.Items {
			if u := p.cfg.Units.Of(&nodes.Items[i]); u != "" {
				nodeUnit[nodes.Items[i].Name] = u
				size[u]++
			}
		}
		prev, changed := p.nodeUnit, !sameKeys(size, p.unitSize)
		p.nodeUnit, p.unitSize = nodeUnit, size
		return prev, changed, nil
	}
	// Read every dirty Node before changing anything: a pass that fails
	// here leaves the state as it was, so the retry still knows where a
	// moved node was.
	prev, now := map[string]string{}, map[string]string{}
	for k := range dirty {
		if k.kind != objectview.KindNodes {
			continue
		}
		prev[k.name], now[k.name] = p.nodeUnit[k.name], ""
		var n corev1.Node
		if err := p.reader.Get(ctx, client.ObjectKey{Name: k.name}, &n, client.UnsafeDisableDeepCopy); err == nil {
			now[k.name] = p.cfg.Units.Of(&n)
		} else if !apierrors.IsNotFound(err) {
			return nil, false, fmt.Errorf("objects: get node %s: %w", k.name, err)
		}
	}
	changed := false
	for name, u := range now {
		was := prev[name]
		if u == was {
			continue
		}
		if was != "" {
			if p.unitSize[was]--; p.unitSize[was] == 0 {
				delete(p.unitSize, was)
				changed = true
			}
			delete(p.nodeUnit, name)
		}
		if u != "" {
			if p.unitSize[u]++; p.unitSize[u] == 1 {
				changed = true
			}
			p.nodeUnit[name] = u
		}
	}
	return prev, changed, nil
}

// sameKeys reports whether a and b have the same keys.
func sameKeys(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

// allKeys lists every object of every kind in the cache.
func (p *Publisher) allKeys(ctx context.Context) ([]key, error) {
	var keys []key
	for _, kind := range objectview.Kinds {
		info, _ := objectview.Kind(kind)
		list := info.NewList().(client.ObjectList)
		if err := p.reader.List(ctx, list); err != nil {
			return nil, fmt.Errorf("objects: list %s: %w", kind, err)
		}
		items, err := metaItems(list)
		if err != nil {
			return nil, err
		}
		for _, o := range items {
			keys = append(keys, key{kind, o.GetNamespace(), o.GetName()})
		}
	}
	return keys, nil
}

// publishObject stores the views of k: the object as the cache holds it,
// or its tombstone, in the shared space; for a Node, in its unit's space
// instead, and a tombstone in the space of the unit it left (prevUnit:
// node → unit at the last pass). The view of a slice or Endpoints
// carries its endpoints' topology (topology). A Node's view found broken
// in the space of a unit it is not in (broken: the spaces) gets a
// tombstone there.
func (p *Publisher) publishObject(ctx context.Context, k key, nodeUnit, prevUnit map[string]string, broken map[string]bool) error {
	info, ok := objectview.Kind(k.kind)
	if !ok {
		return fmt.Errorf("objects: unknown kind %q", k.kind)
	}
	obj := info.New().(client.Object)
	err := p.reader.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: k.name}, obj)
	if apierrors.IsNotFound(err) {
		obj = nil
	} else if err != nil {
		return fmt.Errorf("objects: get %s %s/%s: %w", k.kind, k.namespace, k.name, err)
	}
	// The views to store, by unit token: nil stands for a tombstone.
	type target struct {
		unit string
		view *atollv1.ObjectView
	}
	var targets []target
	isNode := k.kind == objectview.KindNodes
	switch {
	case obj == nil && isNode:
		if u := prevUnit[k.name]; u != "" {
			targets = append(targets, target{u, nil})
		}
	case obj == nil:
		targets = append(targets, target{events.SharedSpace, nil})
		p.track(k, nil)
	case isNode:
		p.setUID(k, obj)
		u := nodeUnit[k.name]
		if was := prevUnit[k.name]; was != "" && was != u {
			targets = append(targets, target{was, nil})
		}
		if u != "" {
			full, err := objectview.Encode(k.kind, trim(obj))
			if err != nil {
				return err
			}
			targets = append(targets, target{u, full})
		}
	default:
		p.setUID(k, obj)
		view := trim(obj)
		topo, nodes, err := p.topology(ctx, k, view)
		if err != nil {
			return err
		}
		if topo != nil {
			view.SetAnnotations(withAnnotation(view.GetAnnotations(), wellknown.EndpointTopologyAnnotation, topo.Encode()))
		}
		p.track(k, nodes)
		shared, err := objectview.Encode(k.kind, view)
		if err != nil {
			return err
		}
		targets = append(targets, target{events.SharedSpace, shared})
	}
	if isNode {
		for u := range broken {
			if u != events.SharedSpace && !slices.ContainsFunc(targets, func(t target) bool { return t.unit == u }) {
				targets = append(targets, target{u, nil})
			}
		}
	}
	var errs []error
	stored := 0
	defer func() { p.metrics.fanout.Observe(float64(stored)) }()
	for _, t := range targets {
		subj, err := objectview.Subject(t.unit, k.kind, k.namespace, k.name)
		if err != nil {
			p.metrics.rejected.WithLabelValues("subject").Inc()
			p.log.Warn("object cannot be named in a subject; left out", "kind", k.kind, "namespace", k.namespace, "name", k.name, "err", err)
			return nil
		}
		if t.view == nil {
			ok, err := p.tombstone(ctx, subj, k)
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				stored++
			}
			continue
		}
		if len(t.view.Object) > p.cfg.MaxObjectBytes {
			p.metrics.rejected.WithLabelValues("too_large").Inc()
			p.log.Warn("object view too large; left out", "subject", subj, "bytes", len(t.view.Object), "max", p.cfg.MaxObjectBytes)
			continue
		}
		ok, err := p.put(ctx, subj, t.view)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			stored++
		}
	}
	if obj == nil {
		p.mu.Lock()
		delete(p.uids, k)
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

func (p *Publisher) setUID(k key, obj client.Object) {
	p.mu.Lock()
	p.uids[k] = string(obj.GetUID())
	p.mu.Unlock()
}

// topology returns the topology the view of k (obj: a slice or an
// Endpoints) carries, and the nodes of its endpoints; nil and none when
// its Service has no topology keys (or is headless, or gone). A node the
// cache does not know is left out (none of its endpoints passes a key
// then); its Node's arrival republishes the view (dependents).
func (p *Publisher) topology(ctx context.Context, k key, obj objectview.Object) (objectview.EndpointTopology, []string, error) {
	svcName := k.name
	if k.kind == objectview.KindEndpointSlices {
		svcName = obj.GetLabels()[discoveryv1.LabelServiceName]
	}
	if svcName == "" {
		return nil, nil, nil
	}
	var svc corev1.Service
	err := p.reader.Get(ctx, client.ObjectKey{Namespace: k.namespace, Name: svcName}, &svc, client.UnsafeDisableDeepCopy)
	if apierrors.IsNotFound(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("objects: get service %s/%s: %w", k.namespace, svcName, err)
	}
	keys := objectview.TopologyKeys(&svc)
	if len(keys) == 0 {
		return nil, nil, nil
	}
	nodes := objectview.EndpointNodes(obj)
	topo := objectview.EndpointTopology{}
	for _, name := range nodes {
		var n corev1.Node
		err := p.reader.Get(ctx, client.ObjectKey{Name: name}, &n, client.UnsafeDisableDeepCopy)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("objects: get node %s: %w", name, err)
		}
		if v := objectview.NodeTopology(keys, n.Labels); v != nil {
			topo[name] = v
		}
	}
	return topo, nodes, nil
}

// withAnnotation is a copy of annotations with k set to v.
func withAnnotation(annotations map[string]string, k, v string) map[string]string {
	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	out[k] = v
	return out
}

// track records that the view of k carries the topology of nodes (none:
// it carries none, or k is gone).
func (p *Publisher) track(k key, nodes []string) {
	for _, n := range p.nodesOf[k] {
		if delete(p.byNode[n], k); len(p.byNode[n]) == 0 {
			delete(p.byNode, n)
		}
	}
	if len(nodes) == 0 {
		delete(p.nodesOf, k)
		return
	}
	p.nodesOf[k] = nodes
	for _, n := range nodes {
		if p.byNode[n] == nil {
			p.byNode[n] = map[key]struct{}{}
		}
		p.byNode[n][k] = struct{}{}
	}
}

// dependents adds to keys the views that depend on what else changed: a
// Service's slices and Endpoints (its topology keys decide their
// topology), and the slices and Endpoints with endpoints on a Node whose
// labels changed since the last pass that read it (or that came or went;
// or whose labels were not kept: only those of Nodes that some view
// carries the topology of are). A Node's status update, the common
// event, costs one cache read. A full pass (keys: every object) only
// brings the kept labels up to date.
func (p *Publisher) dependents(ctx context.Context, keys []key, full bool) ([]key, error) {
	set := map[key]bool{}
	for _, k := range keys {
		set[k] = true
	}
	add := func(k key) {
		if !set[k] {
			set[k] = true
			keys = append(keys, k)
		}
	}
	for _, k := range slices.Clone(keys) {
		switch k.kind {
		case objectview.KindServices:
			if full {
				continue
			}
			var list discoveryv1.EndpointSliceList
			if err := p.reader.List(ctx, &list, client.InNamespace(k.namespace),
				client.MatchingLabels{discoveryv1.LabelServiceName: k.name}, client.UnsafeDisableDeepCopy); err != nil {
				return nil, fmt.Errorf("objects: list slices of service %s/%s: %w", k.namespace, k.name, err)
			}
			for i := range list.Items {
				add(key{objectview.KindEndpointSlices, k.namespace, list.Items[i].Name})
			}
			add(key{objectview.KindEndpoints, k.namespace, k.name})
		case objectview.KindNodes:
			// Only the Nodes some view carries the topology of are
			// compared (and their labels kept).
			if len(p.byNode[k.name]) == 0 {
				delete(p.labels, k.name)
				continue
			}
			var n corev1.Node
			err := p.reader.Get(ctx, client.ObjectKey{Name: k.name}, &n, client.UnsafeDisableDeepCopy)
			var labels map[string]string
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, fmt.Errorf("objects: get node %s: %w", k.name, err)
			default:
				labels = n.Labels
			}
			was, known := p.labels[k.name]
			if known && err == nil && maps.Equal(was, labels) {
				continue
			}
			if err != nil {
				delete(p.labels, k.name)
			} else {
				p.labels[k.name] = maps.Clone(labels)
			}
			for _, d := range slices.SortedFunc(maps.Keys(p.byNode[k.name]), compareKeys) {
				add(d)
			}
		}
	}
	return keys, nil
}

func compareKeys(a, b key) int {
	return strings.Compare(a.kind+"/"+a.namespace+"/"+a.name, b.kind+"/"+b.namespace+"/"+b.name)
}

// tombstone stores the tombstone of k on subj, unless the stream holds
// nothing there or a tombstone already, and says whether it stored it.
func (p *Publisher) tombstone(ctx context.Context, subj string, k key) (bool, error) {
	p.mu.Lock()
	uid := p.uids[k]
	p.mu.Unlock()
	last, err := p.views.Last(ctx, subj)
	if err != nil {
		return false, err
	}
	if last.Seq == 0 || last.Empty {
		return false, nil
	}
	v, err := objectview.Tombstone(k.kind, k.namespace, k.name, uid)
	if err != nil {
		return false, err
	}
	return p.put(ctx, subj, v)
}

// put makes v the last value stored on subj, unless it already is (same
// fingerprint), and says whether it stored it.
func (p *Publisher) put(ctx context.Context, subj string, v *atollv1.ObjectView) (bool, error) {
	res, err := p.views.Put(ctx, subj, v)
	p.metrics.conflicts.Add(float64(res.Conflicts))
	if res.PublishFailed {
		p.metrics.rejected.WithLabelValues("publish_failed").Inc()
	}
	if err != nil || !res.Changed {
		return false, err
	}
	p.metrics.published.WithLabelValues(v.GetKind()).Inc()
	p.metrics.bytes.Add(float64(res.Bytes))
	return true, nil
}

// tombstoneStale leaves a tombstone on every subject of the stream that
// no live object accounts for (objects deleted while no replica ran): in
// the shared space (whose Nodes purgeSharedNodes removes), and among the
// Nodes of each current unit's space.
// Spaces of units that no longer exist are left alone.
func (p *Publisher) tombstoneStale(ctx context.Context, live []key, units []string) error {
	want := map[string]bool{}
	nodeUnit := p.nodeUnit
	for _, k := range live {
		if k.kind != objectview.KindNodes {
			if s, err := objectview.Subject(events.SharedSpace, k.kind, k.namespace, k.name); err == nil {
				want[s] = true
			}
		}
		if u := nodeUnit[k.name]; k.kind == objectview.KindNodes && u != "" {
			if s, err := objectview.Subject(u, k.kind, k.namespace, k.name); err == nil {
				want[s] = true
			}
		}
	}
	var filters []string
	for _, kind := range sharedKinds {
		filters = append(filters, kindFilter(events.SharedSpace, kind))
	}
	for _, u := range units {
		filters = append(filters, kindFilter(u, objectview.KindNodes))
	}
	var errs []error
	for _, filter := range filters {
		subjects, err := p.subjects(ctx, filter)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, subj := range subjects {
			if want[subj] {
				continue
			}
			vk, err := events.ParseViewSubject(subj)
			if err != nil {
				continue
			}
			ns := vk.Namespace
			if ns == events.ClusterScoped {
				ns = ""
			}
			if _, err := p.tombstone(ctx, subj, key{vk.Kind, ns, vk.Name}); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// kindFilter matches the views of kind in the space of unit (a unit, or
// events.SharedSpace).
func kindFilter(unit, kind string) string {
	return strings.TrimSuffix(events.ViewSubjects, ">") + events.Token(unit) + "." + kind + ".>"
}

// subjects lists the subjects of the VIEWS stream matching filter.
func (p *Publisher) subjects(ctx context.Context, filter string) ([]string, error) {
	if p.stream == nil {
		st, err := p.js.Stream(ctx, events.StreamViews)
		if err != nil {
			return nil, fmt.Errorf("objects: stream %s: %w", events.StreamViews, err)
		}
		p.stream = st
	}
	info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("objects: subjects %s: %w", filter, err)
	}
	return slices.Sorted(maps.Keys(info.State.Subjects)), nil
}

// metaItems returns the items of list.
func metaItems(list client.ObjectList) ([]metav1.Object, error) {
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, fmt.Errorf("objects: list items: %w", err)
	}
	out := make([]metav1.Object, 0, len(items))
	for _, it := range items {
		o, err := meta.Accessor(it)
		if err != nil {
			return nil, fmt.Errorf("objects: list items: %w", err)
		}
		out = append(out, o)
	}
	return out, nil
}
