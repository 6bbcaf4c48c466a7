package hostrecords

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Publisher publishes the host records of every unit.
type Publisher struct {
	cfg     Config
	reader  client.Reader
	bus     *hublink.Link
	log     *slog.Logger
	metrics *metrics

	views   *eventbus.LastValue[*atollv1.HostRecords] // each unit's set, as stored
	changed chan struct{}
}

// New returns a publisher reading the cluster through reader (the
// manager's cache) and publishing through b.
// Its metrics are registered with reg (nil: not registered).
func New(cfg Config, reader client.Reader, b *hublink.Link, log *slog.Logger, reg prometheus.Registerer) (*Publisher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if reader == nil {
		return nil, errors.New("hostrecords: no Kubernetes reader")
	}
	return &Publisher{
		cfg: cfg, reader: reader, bus: b, log: log.With("component", "hostrecords"), metrics: newMetrics(reg),
		views: eventbus.NewLastValue(b.JetStream, events.StreamViews, eventbus.LastValueOptions[*atollv1.HostRecords]{
			Stamp: func(recs *atollv1.HostRecords) *atollv1.HostRecords {
				m := proto.Clone(recs).(*atollv1.HostRecords)
				m.Time = timestamppb.Now()
				return m
			},
			// A unit without records gets no empty set where none was stored.
			Empty: func(recs *atollv1.HostRecords) bool { return len(recs.GetRecords()) == 0 },
		}),
		changed: make(chan struct{}, 1),
	}, nil
}

// Changed asks for a pass.
func (p *Publisher) Changed() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// Resync has the next pass compare every unit's records with the stream.
func (p *Publisher) Resync() {
	p.views.ForgetAll()
	p.Changed()
}

// Run publishes until ctx is done. The first pass runs at once.
func (p *Publisher) Run(ctx context.Context) error {
	return p.bus.RunPasses(ctx, hublink.Passes{
		Name: "host records", Changed: p.changed, Log: p.log, First: true,
		Resync: p.cfg.Resync, OnResync: func() { p.views.ForgetAll() },
		Debounce: p.cfg.Debounce, Pass: p.pass,
	})
}

// pass computes every unit's records and publishes those the stream does
// not hold. A unit with no records gets an empty set, unless the stream
// holds none (a grid deleted empties its units' files).
func (p *Publisher) pass(ctx context.Context) error {
	var nodes corev1.NodeList
	if err := p.reader.List(ctx, &nodes); err != nil {
		return fmt.Errorf("hostrecords: list nodes: %w", err)
	}
	units := map[string]bool{}
	for i := range nodes.Items {
		if u := p.cfg.Units.Of(&nodes.Items[i]); u != "" {
			units[u] = true
		}
	}
	var grids appsv1alpha1.StatefulSetGridList
	if err := p.reader.List(ctx, &grids); err != nil {
		return fmt.Errorf("hostrecords: list statefulsetgrids: %w", err)
	}
	var pods corev1.PodList
	if err := p.reader.List(ctx, &pods, client.HasLabels{wellknown.LabelGrid}); err != nil {
		return fmt.Errorf("hostrecords: list pods: %w", err)
	}
	res := Compute(grids.Items, pods.Items, p.cfg.Units.Label, p.cfg.ClusterDomain)
	records := 0
	for _, r := range res.Units {
		records += len(r.Records)
	}
	p.metrics.units.Set(float64(len(units)))
	p.metrics.records.Set(float64(records))
	for _, reason := range []string{SkipGridKey, SkipNotOwned, SkipNoService} {
		p.metrics.skipped.WithLabelValues(reason).Set(float64(res.Skipped[reason]))
	}
	var errs []error
	for _, u := range slices.Sorted(maps.Keys(units)) {
		recs := res.Units[u]
		if recs == nil {
			recs = &atollv1.HostRecords{Unit: u}
			recs.Fingerprint = Fingerprint(recs)
		}
		if err := p.put(ctx, u, recs); err != nil {
			p.metrics.failed.Inc()
			errs = append(errs, err)
		}
	}
	p.metrics.passes.Inc()
	return errors.Join(errs...)
}

// put makes recs the last value stored on the unit's subject, unless it
// already is (same fingerprint) or recs is empty and nothing was ever
// stored there (eventbus.LastValue).
func (p *Publisher) put(ctx context.Context, unit string, recs *atollv1.HostRecords) error {
	subj, err := events.HostsSubject(unit)
	if err != nil {
		return fmt.Errorf("hostrecords: %w", err)
	}
	res, err := p.views.Put(ctx, subj, recs)
	p.metrics.conflicts.Add(float64(res.Conflicts))
	if err != nil || !res.Changed {
		return err
	}
	p.metrics.published.Inc()
	p.metrics.bytes.Add(float64(res.Bytes))
	p.log.Debug("host records published", "unit", unit, "records", len(recs.GetRecords()), "seq", res.Seq)
	return nil
}
