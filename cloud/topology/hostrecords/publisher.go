package hostrecords

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// maxPutAttempts bounds the publishes of one unit's records in one pass.
const maxPutAttempts = 5

// Publisher publishes the host records of every unit.
type Publisher struct {
	cfg     Config
	reader  client.Reader
	bus     *hublink.Link
	log     *slog.Logger
	metrics *metrics

	js    jetstream.JetStream
	views jetstream.Stream

	mu        sync.Mutex
	published map[string]stored // subject → the stream's last value there, as last seen
	changed   chan struct{}
}

// stored is the stream's last value on one subject as last seen.
type stored struct {
	fp    string
	seq   uint64
	empty bool
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
		published: map[string]stored{}, changed: make(chan struct{}, 1),
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
	p.mu.Lock()
	p.published = map[string]stored{}
	p.mu.Unlock()
	p.Changed()
}

// Run publishes until ctx is done. The first pass runs at once.
func (p *Publisher) Run(ctx context.Context) error {
	p.js = p.bus.JetStream()
	resync := time.NewTicker(p.cfg.Resync)
	defer resync.Stop()
	link := time.NewTicker(2 * time.Second)
	defer link.Stop()
	reconnects := p.reconnects()
	p.Changed()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.changed:
		case <-resync.C:
			p.Resync()
			continue
		case <-link.C:
			if n := p.reconnects(); n != reconnects {
				reconnects = n
				p.log.Info("hub link reconnected; comparing every unit's host records with the stream")
				p.Resync()
			}
			continue
		}
		if p.cfg.Debounce > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(p.cfg.Debounce):
			}
		}
		if err := p.pass(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("host records pass incomplete; retrying", "err", err)
			time.AfterFunc(time.Second, p.Changed)
		}
	}
}

func (p *Publisher) reconnects() uint64 {
	if nc := p.bus.Conn(); nc != nil {
		return nc.Stats().Reconnects
	}
	return 0
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
		if u := p.unitOf(&nodes.Items[i]); u != "" {
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
	res := Compute(grids.Items, pods.Items, p.cfg.UnitLabel, p.cfg.ClusterDomain)
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

// unitOf is node's unit, "" for none.
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

// put makes recs the last value stored on the unit's subject, unless it
// already is (same fingerprint) or recs is empty and nothing was ever
// stored there. The publish expects the subject's last sequence to be the
// one read; the message id is <subject>@<fingerprint>@<sequence it
// replaces>, and a Duplicate ack is checked against the stream.
func (p *Publisher) put(ctx context.Context, unit string, recs *atollv1.HostRecords) error {
	subj, err := events.HostsSubject(unit)
	if err != nil {
		return fmt.Errorf("hostrecords: %w", err)
	}
	fp := recs.GetFingerprint()
	p.mu.Lock()
	last, known := p.published[subj]
	p.mu.Unlock()
	nonce := ""
	for attempt := 1; ; attempt++ {
		if !known {
			if last, err = p.stored(ctx, subj); err != nil {
				return err
			}
		}
		if last.fp == fp || (last.seq == 0 && len(recs.GetRecords()) == 0) {
			p.remember(subj, last)
			return nil
		}
		if attempt > maxPutAttempts {
			p.forget(subj)
			return fmt.Errorf("hostrecords: %s: the stored value kept changing under %d attempts", subj, maxPutAttempts)
		}
		m := proto.Clone(recs).(*atollv1.HostRecords)
		m.Time = timestamppb.Now()
		id := subj + "@" + fp + "@" + strconv.FormatUint(last.seq, 10) + nonce
		ack, err := events.PublishDurable(ctx, p.js, subj, m, id, jetstream.WithExpectLastSequencePerSubject(last.seq))
		if isWrongLastSequence(err) {
			p.metrics.conflicts.Inc()
			known = false
			continue
		}
		if err != nil {
			p.forget(subj)
			return err
		}
		if ack.Duplicate {
			now, err := p.stored(ctx, subj)
			if err != nil {
				p.forget(subj)
				return err
			}
			if now.fp != fp {
				if now.seq == last.seq {
					var raw [8]byte
					_, _ = rand.Read(raw[:])
					nonce = "@" + hex.EncodeToString(raw[:])
				}
				last, known = now, true
				continue
			}
			ack.Sequence = now.seq
		}
		p.remember(subj, stored{fp: fp, seq: ack.Sequence, empty: len(recs.GetRecords()) == 0})
		p.metrics.published.Inc()
		p.metrics.bytes.Add(float64(proto.Size(m)))
		p.log.Debug("host records published", "unit", unit, "records", len(recs.GetRecords()), "seq", ack.Sequence)
		return nil
	}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func (p *Publisher) remember(subj string, st stored) {
	p.mu.Lock()
	p.published[subj] = st
	p.mu.Unlock()
}

func (p *Publisher) forget(subj string) {
	p.mu.Lock()
	delete(p.published, subj)
	p.mu.Unlock()
}

// stored reads the last message the VIEWS stream holds on subj.
func (p *Publisher) stored(ctx context.Context, subj string) (stored, error) {
	if p.views == nil {
		st, err := p.js.Stream(ctx, events.StreamViews)
		if err != nil {
			return stored{}, fmt.Errorf("hostrecords: stream %s: %w", events.StreamViews, err)
		}
		p.views = st
	}
	raw, err := p.views.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return stored{}, nil
	}
	if err != nil {
		return stored{}, fmt.Errorf("hostrecords: last value of %s: %w", subj, err)
	}
	var v atollv1.HostRecords
	if err := proto.Unmarshal(raw.Data, &v); err != nil {
		return stored{seq: raw.Sequence}, nil
	}
	return stored{fp: v.GetFingerprint(), seq: raw.Sequence, empty: len(v.GetRecords()) == 0}, nil
}
