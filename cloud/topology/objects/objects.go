// Package objects publishes the cloud's per-unit views of Services,
// EndpointSlices, Endpoints and Nodes on the hub's VIEWS stream, one
// message per object and unit (atoll.view.<unit>.<kind>.<namespace>.<name>),
// for the edge proxies that serve them to kube-proxy (edge/proxy).
//
// Every unit gets every Service, EndpointSlice and Endpoints: the topology
// filter runs at the edge, where the host's own labels decide, so one view
// per unit serves all its nodes. Nodes of the unit are published in full
// (kube-proxy reads its own Node); Nodes of other units with their name,
// uid and labels only (the filter reads the labels of the endpoints'
// nodes). A deleted object leaves a tombstone (ObjectView.deleted).
//
// Each view is stored with events.LastValue: published only when the
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

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
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
	stream jetstream.Stream                       // VIEWS, for its subjects (tombstoneStale)
	views  *events.LastValue[*atollv1.ObjectView] // each subject's view, as stored

	mu       sync.Mutex
	dirty    map[key]bool
	all      bool              // the next pass handles every object
	units    map[string]bool   // units of the last pass
	nodeUnit map[string]string // node → unit, of the last pass
	uids     map[key]string    // uid of each object last seen, for its tombstone
	changed  chan struct{}
}

// New returns a publisher reading the cluster through reader (the
// manager's cache) and publishing through b.
func New(cfg Config, reader client.Reader, b *hublink.Link, log *slog.Logger, m *metrics) (*Publisher, error) {
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
		dirty: map[key]bool{}, all: true, units: map[string]bool{}, nodeUnit: map[string]string{},
		views: events.NewLastValue(b.JetStream, events.StreamViews, events.LastValueOptions[*atollv1.ObjectView]{
			Stamp: func(v *atollv1.ObjectView) *atollv1.ObjectView {
				m := proto.Clone(v).(*atollv1.ObjectView)
				m.Time = timestamppb.Now()
				return m
			},
			// A tombstone is not stored where nothing was.
			Empty: (*atollv1.ObjectView).GetDeleted,
		}),
		uids:    map[key]string{},
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
	return p.bus.RunPasses(ctx, hublink.Passes{
		Name: "object views", Changed: p.changed, Log: p.log,
		Resync: p.cfg.Resync, OnResync: p.forgetAll,
		Debounce: p.cfg.Debounce, Pass: p.pass,
	})
}

// pass publishes the views of the changed objects, or of every object
// when the unit set changed or a resync asked for it.
func (p *Publisher) pass(ctx context.Context) error {
	var nodes corev1.NodeList
	if err := p.reader.List(ctx, &nodes); err != nil {
		return fmt.Errorf("objects: list nodes: %w", err)
	}
	nodeUnit := map[string]string{}
	units := map[string]bool{}
	for i := range nodes.Items {
		if u := p.unitOf(&nodes.Items[i]); u != "" {
			nodeUnit[nodes.Items[i].Name] = u
			units[u] = true
		}
	}
	p.mu.Lock()
	all := p.all || !maps.Equal(units, p.units)
	dirty := p.dirty
	p.dirty, p.all = map[key]bool{}, false
	// A node that changed units changes its own view in both.
	p.units, p.nodeUnit = units, nodeUnit
	p.mu.Unlock()

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
	unitList := slices.Sorted(maps.Keys(units))
	p.metrics.units.Set(float64(len(unitList)))
	var failed []error
	retry := map[key]bool{}
	for _, k := range keys {
		if err := p.publishObject(ctx, k, unitList, nodeUnit); err != nil {
			failed = append(failed, err)
			retry[k] = true
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

// unitOf is node's unit, "" for none (no label, an excluded node, a value
// that cannot name a unit).
func (p *Publisher) unitOf(n *corev1.Node) string {
	for _, l := range p.cfg.ExcludeLabels {
		if _, ok := n.Labels[l]; ok {
			return ""
		}
	}
	u := n.Labels[p.cfg.UnitLabel]
	if u == "" || events.ValidUnit(u) != nil {
		return ""
	}
	return u
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

// publishObject puts the view of k in every unit: the object as the cache
// holds it, or its tombstone.
func (p *Publisher) publishObject(ctx context.Context, k key, units []string, nodeUnit map[string]string) error {
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
	var full, stripped *atollv1.ObjectView
	if obj != nil {
		p.mu.Lock()
		p.uids[k] = string(obj.GetUID())
		p.mu.Unlock()
		if full, err = objectview.Encode(k.kind, trim(obj, true)); err != nil {
			return err
		}
		if k.kind == objectview.KindNodes {
			if stripped, err = objectview.Encode(k.kind, trim(obj, false)); err != nil {
				return err
			}
		}
	}
	var errs []error
	stored := 0
	defer func() { p.metrics.fanout.Observe(float64(stored)) }()
	for _, u := range units {
		subj, err := objectview.Subject(u, k.kind, k.namespace, k.name)
		if err != nil {
			p.metrics.rejected.WithLabelValues("subject").Inc()
			p.log.Warn("object cannot be named in a subject; left out", "kind", k.kind, "namespace", k.namespace, "name", k.name, "err", err)
			return nil
		}
		v := full
		if stripped != nil && nodeUnit[k.name] != u {
			v = stripped
		}
		if v == nil {
			ok, err := p.tombstone(ctx, subj, k)
			if err != nil {
				errs = append(errs, err)
			}
			if ok {
				stored++
			}
			continue
		}
		if len(v.Object) > p.cfg.MaxObjectBytes {
			p.metrics.rejected.WithLabelValues("too_large").Inc()
			p.log.Warn("object view too large; left out", "subject", subj, "bytes", len(v.Object), "max", p.cfg.MaxObjectBytes)
			continue
		}
		ok, err := p.put(ctx, subj, v)
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
// no live object and unit account for (objects deleted while no replica
// ran). Subjects of units that no longer exist are left alone.
func (p *Publisher) tombstoneStale(ctx context.Context, live []key, units []string) error {
	want := map[string]bool{}
	for _, k := range live {
		for _, u := range units {
			if s, err := objectview.Subject(u, k.kind, k.namespace, k.name); err == nil {
				want[s] = true
			}
		}
	}
	if p.stream == nil {
		st, err := p.js.Stream(ctx, events.StreamViews)
		if err != nil {
			return fmt.Errorf("objects: stream %s: %w", events.StreamViews, err)
		}
		p.stream = st
	}
	var errs []error
	for _, u := range units {
		for _, kind := range objectview.Kinds {
			unitViews, err := events.UnitViewSubjects(u)
			if err != nil {
				continue
			}
			filter := strings.TrimSuffix(unitViews, ">") + kind + ".>"

			info, err := p.stream.Info(ctx, jetstream.WithSubjectFilter(filter))
			if err != nil {
				errs = append(errs, fmt.Errorf("objects: subjects %s: %w", filter, err))
				continue
			}
			for subj := range info.State.Subjects {
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
	}
	return errors.Join(errs...)
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
