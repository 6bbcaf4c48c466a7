// Package proxy is the edge endpoints proxy: kube-proxy (and any client-go
// informer, kubectl) uses it as its apiserver through a kubeconfig, and it
// answers from the views the cloud publishes for the node's unit and for
// every unit (cloud/topology/objects), filtered by the Services' topology
// keys against the host's own labels. It holds no Kubernetes credentials and writes
// nothing to Kubernetes.
//
// The store (store.go) numbers every change with the proxy's own
// revision; the server (server.go) serves list, get and watch with
// bookmarks, resumes and 410 Gone; the follower reads the unit's view
// space and the shared one with a view feed each (edge/viewfeed: the
// hub's republished views, caught up from the VIEWS stream from the
// space's cursor), so the proxy holds no consumer on the hub in steady
// state; the state is kept on disk (state.go) so that a restart with the
// hub down serves at once and resumes the stream where it left off.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// UnitSource tells the proxy the node's current unit (edge/membership).
type UnitSource interface {
	// Unit is the node's unit, "" while in none.
	Unit() string
	// Changes is signalled when the unit may have changed.
	Changes() <-chan struct{}
}

// Proxy runs the store, its follower, its persistence and the server.
type Proxy struct {
	cfg   Config
	host  string
	link  *hublink.Link
	feeds *viewfeed.Feeds
	units UnitSource
	log   *slog.Logger
	store *Store
	api   *Server
	srv   *http.Server
	ln    net.Listener
}

// New returns the proxy of node host, following views with feeds (and
// listing the stream's subjects over link to end a migration). m may be
// nil (metrics not exported).
func New(cfg Config, host string, link *hublink.Link, feeds *viewfeed.Feeds, units UnitSource, log *slog.Logger, m *metrics) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if host == "" {
		return nil, errors.New("proxy: no node name")
	}
	log = log.With("component", "proxy")
	store := NewStore(host, cfg.MaxTombstones, m)
	if cfg.StateDir != "" {
		start := time.Now()
		ok, err := store.Load(cfg.StateDir)
		if err != nil {
			log.Warn("ignoring the kept views", "err", err)
			store = NewStore(host, cfg.MaxTombstones, m)
		} else if ok {
			log.Info("restored views from disk", "unit", store.Unit(), "seq", store.SeqOf(UnitSpace), "shared_seq", store.SeqOf(SharedSpace),
				"rev", store.Rev(), "migrating", store.Migrating(), "took", time.Since(start))
		}
	}
	p := &Proxy{cfg: cfg, host: host, link: link, feeds: feeds, units: units, log: log, store: store}
	p.api = NewServer(store, cfg.Bookmark, log)
	return p, nil
}

// Store is the proxy's store.
func (p *Proxy) Store() *Store { return p.store }

// Listen binds the server's address (synchronously, at start).
func (p *Proxy) Listen() error {
	ln, err := net.Listen("tcp", p.cfg.Addr)
	if err != nil {
		return fmt.Errorf("proxy: listen %s: %w", p.cfg.Addr, err)
	}
	p.ln = ln
	p.srv = &http.Server{Handler: p.api, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// Addr is the address the server listens on (after Listen).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Run serves, follows the views and keeps them on disk until ctx is done.
func (p *Proxy) Run(ctx context.Context) error {
	if p.ln == nil {
		if err := p.Listen(); err != nil {
			return err
		}
	}
	go func() {
		if err := p.srv.Serve(p.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.log.Error("proxy server stopped", "err", err)
		}
	}()
	saved := make(chan struct{})
	go func() { defer close(saved); p.keep(ctx) }()
	p.follow(ctx)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(shutdown)
	_ = p.srv.Close() // watches do not end by themselves
	<-saved
	return nil
}

// keep writes the store to disk after each change (coalesced over
// SaveDelay) and once more at the end.
func (p *Proxy) keep(ctx context.Context) {
	if p.cfg.StateDir == "" {
		return
	}
	save := func() {
		if n, err := p.store.Save(p.cfg.StateDir); err != nil {
			p.log.Warn("keeping the views on disk failed", "err", err)
		} else {
			p.store.metrics.stateBytes.Set(float64(n))
		}
	}
	for {
		changed := p.store.Changed()
		select {
		case <-ctx.Done():
			save()
			p.store.Close()
			return
		case <-changed:
		}
		select {
		case <-ctx.Done():
		case <-time.After(p.cfg.SaveDelay):
		}
		save()
	}
}

// follow reads the views of the node's unit from the hub (its own space
// and the shared one), from the last sequence applied of each, switching
// (and resetting the unit's space) when the unit changes, and retrying
// while the hub is unreachable.
func (p *Proxy) follow(ctx context.Context) {
	changes := p.units.Changes()
	for ctx.Err() == nil {
		unit := p.units.Unit()
		if unit == "" {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				continue
			}
		}
		if p.store.Unit() != unit {
			p.log.Info("following the views of a new unit", "unit", unit, "was", p.store.Unit())
			p.store.Reset(unit)
		}
		uctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.consumeAll(uctx, unit) }()
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case <-changes:
				if p.units.Unit() != unit {
					cancel()
					err = <-done
					break wait
				}
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			p.log.Debug("views follower stopped; retrying", "unit", unit, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// consumeAll reads both spaces of unit's views, each with its own feed,
// until ctx is done or one fails.
func (p *Proxy) consumeAll(ctx context.Context, unit string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(Spaces))
	for _, sp := range Spaces {
		go func() { errs <- p.consume(ctx, unit, sp) }()
	}
	err := <-errs
	cancel()
	return errors.Join(err, <-errs)
}

// filterOf is the subjects of space sp for unit.
func filterOf(unit string, sp Space) (string, error) {
	if sp == SharedSpace {
		return events.SharedSpaceSubjects(), nil
	}
	return events.UnitViewSubjects(unit)
}

// endReload ends a reload of space sp from the stream created at
// created, and then a migration that waited for the shared space.
func (p *Proxy) endReload(ctx context.Context, unit string, sp Space, created int64) {
	gone := p.store.EndReload(sp, created)
	p.log.Info("read the views again from the stream's start", "unit", unit, "space", sp, "seq", p.store.SeqOf(sp), "deleted", gone)
	if sp == SharedSpace {
		p.endMigration(ctx, unit)
	}
}

// endMigration ends the migration of a state kept before the shared
// space, once that was read in full: the Nodes of the unit's space the
// stream no longer holds there (other units' Nodes of the old layout,
// which the cloud purged) are dropped. On an error it is left for the
// next start of the consumers.
func (p *Proxy) endMigration(ctx context.Context, unit string) {
	if !p.store.Migrating() || p.store.Reloading(SharedSpace) {
		return
	}
	filter, err := events.UnitViewSubjects(unit)
	if err != nil {
		return
	}
	filter = strings.TrimSuffix(filter, ">") + objectview.KindNodes + ".>"
	held, err := p.subjectsHeld(ctx, filter)
	if err != nil {
		p.log.Warn("cannot list the unit's Nodes to end the move to the shared views; retrying later", "unit", unit, "err", err)
		return
	}
	gone := p.store.EndMigration(func(node string) bool {
		subj, err := objectview.Subject(unit, objectview.KindNodes, "", node)
		return err == nil && held[subj]
	})
	p.log.Info("moved the kept views to the shared view space", "unit", unit, "nodes_dropped", gone)
}

// subjectsHeld lists the subjects of the VIEWS stream matching filter,
// with a consumer on the last message of each, headers only (the edge may
// create consumers on its own views; it is not given the stream's
// subject list).
func (p *Proxy) subjectsHeld(ctx context.Context, filter string) (map[string]bool, error) {
	js := p.link.JetStream()
	if js == nil {
		return nil, errors.New("proxy: no hub link yet")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, events.StreamViews, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, HeadersOnly: true})
	if err != nil {
		return nil, fmt.Errorf("proxy: list %s: %w", filter, err)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("proxy: list %s: %w", filter, err)
	}
	held := map[string]bool{}
	for pending := info.NumPending; pending > 0; {
		batch, err := cons.Fetch(int(min(pending, 1000)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("proxy: list %s: %w", filter, err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			held[m.Subject()] = true
			if md, err := m.Metadata(); err == nil {
				pending = md.NumPending
			}
		}
		if err := batch.Error(); err != nil && n == 0 {
			return nil, fmt.Errorf("proxy: list %s: %w", filter, err)
		}
		if n == 0 {
			return nil, fmt.Errorf("proxy: list %s: nothing delivered with %d pending", filter, pending)
		}
	}
	return held, nil
}

// noCursor applies a view without moving its space's cursor.
const noCursor = 0

// consume follows space sp of unit's views from its cursor on with a view
// feed, until ctx is done or the feed fails. The feed finds a rebuilt
// stream (its creation time is not the cursor's, or it ends before the
// cursor) and reads the space again in full: the store's reload
// (reload.go) ends at the catch-up that read it, unless the shared space
// is empty on a hub whose cloud has not moved to it yet while a kept
// state migrates: then the kept views stay until shared views arrive.
func (p *Proxy) consume(ctx context.Context, unit string, sp Space) error {
	filter, err := filterOf(unit, sp)
	if err != nil {
		return err
	}
	var created time.Time
	if c := p.store.StreamCreated(sp); c != 0 {
		created = time.Unix(0, c)
	}
	// Views of the space applied since its reload began; none at the end
	// of a catch-up that read it in full: the hub holds none.
	seen := 0
	var feed *viewfeed.Feed
	feed, err = p.feeds.New(viewfeed.Options{
		Name: "proxy_" + sp.String(), Filter: filter, Start: p.store.SeqOf(sp), Created: created,
		Apply: func(_ context.Context, m viewfeed.Msg) error {
			seen++
			if seen == 1 && p.store.Reloading(sp) && sp == SharedSpace && p.store.Migrating() {
				// The first shared view of a migration that waited for
				// them: read the space in full now.
				feed.CatchUpNow()
			}
			key, err := events.ParseViewSubject(m.Subject)
			if _, ok := objectview.Kind(key.Kind); err != nil || !ok {
				return nil
			}
			var v atollv1.ObjectView
			if err := proto.Unmarshal(m.Data, &v); err != nil {
				return fmt.Errorf("a view that does not decode: %w", err)
			}
			p.store.metrics.viewBytes.Add(float64(len(m.Data)))
			p.store.metrics.viewSize.Observe(float64(len(m.Data)))
			// The space's cursor is the feed's verified one (CaughtUp),
			// not the last view applied: kept on disk, it is where a
			// restart may start without missing a view lost on the way.
			return p.store.Apply(sp, &v, noCursor)
		},
		Reset: func(context.Context) {
			p.log.Warn("the views stream was rebuilt; reading the views again", "unit", unit, "space", sp)
			p.store.BeginReload(sp)
			seen = 0
		},
		CaughtUp: func(ctx context.Context, c viewfeed.CatchUp) {
			p.store.Advance(sp, c.Verified)
			switch {
			case !p.store.Reloading(sp):
				p.store.SetStreamCreated(sp, c.Created.UnixNano())
				if sp == SharedSpace {
					p.endMigration(ctx, unit) // left by an earlier run
				}
			case seen == 0 && sp == SharedSpace && p.store.Migrating():
				p.log.Warn("no shared views on the hub yet; keeping the views kept before them", "unit", unit)
			default:
				p.endReload(ctx, unit, sp, c.Created.UnixNano())
			}
		},
	})
	if err != nil {
		return err
	}
	return feed.Run(ctx)
}
