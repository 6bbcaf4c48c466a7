// Package proxy is the edge endpoints proxy: kube-proxy (and any client-go
// informer, kubectl) uses it as its apiserver through a kubeconfig, and it
// answers from the views the cloud publishes for the node's unit and for
// every unit (cloud/views/objects), filtered by the Services' topology
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
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
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

// RelayNode is what relaying the shared views needs of the node
// (*natsnode.Node): the key the cloud signs them with, and whether the
// node is routed to every member of its unit.
type RelayNode interface {
	CloudKey() string
	Meshed() bool
}

// Proxy runs the store, its follower, its persistence and the server.
type Proxy struct {
	cfg   Config
	relay RelayNode // nil: no relaying
	host  string
	feeds *viewfeed.Feeds
	units UnitSource
	log   *slog.Logger
	store *Store
	api   *Server
	srv   *http.Server
	ln    net.Listener
}

// New returns the proxy of node host, following views with feeds. m may
// be nil (metrics not exported).
func New(cfg Config, host string, feeds *viewfeed.Feeds, units UnitSource, log *slog.Logger, m *metrics) (*Proxy, error) {
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
				"rev", store.Rev(), "took", time.Since(start))
		}
	}
	p := &Proxy{cfg: cfg, host: host, feeds: feeds, units: units, log: log, store: store}
	p.api = NewServer(store, cfg.Bookmark, log)
	return p, nil
}

// Store is the proxy's store.
func (p *Proxy) Store() *Store { return p.store }

// RelayThrough makes the proxy share the hub's copies of the shared views
// with its unit through node (Config.RelayViews; viewfeed.Relay). Call it
// before Run.
func (p *Proxy) RelayThrough(node RelayNode) { p.relay = node }

// admit checks a shared view a unit peer relayed: stamped by the cloud
// within RelayFreshness of this node's clock, and not before what the
// store holds of its object (Store.Admit).
func (p *Proxy) admit(m viewfeed.Msg) error {
	var v atollv1.ObjectView
	if err := proto.Unmarshal(m.Data, &v); err != nil {
		return fmt.Errorf("a view that does not decode: %w", err)
	}
	if !v.GetTime().IsValid() {
		return errors.New("a view without the cloud's time")
	}
	if d := time.Since(v.GetTime().AsTime()); d > p.cfg.RelayFreshness || d < -p.cfg.RelayFreshness {
		return fmt.Errorf("stamped %s from this node's clock, beyond %s (a replay, or a clock off)", d.Round(time.Second), p.cfg.RelayFreshness)
	}
	return p.store.Admit(SharedSpace, &v)
}

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
// SaveDelay), again every SaveRetry while the disk refuses it, and once
// more at the end.
func (p *Proxy) keep(ctx context.Context) {
	if p.cfg.StateDir == "" {
		return
	}
	failing := false
	save := func() {
		n, err := p.store.Save(p.cfg.StateDir)
		switch {
		case err != nil && !failing:
			p.log.Warn("keeping the views on disk failed; trying again", "every", p.cfg.SaveRetry.String(), "err", err)
		case err == nil && failing:
			p.log.Info("keeping the views on disk again")
		}
		failing = err != nil
		if err == nil {
			p.store.metrics.stateBytes.Set(float64(n))
		}
	}
	// What changed before keep ran (follow starts beside it) is written
	// at once. The next change is awaited from before each write: one
	// made while a write runs comes round again.
	changed := p.store.Changed()
	save()
	for {
		var retry <-chan time.Time
		if failing {
			retry = time.After(p.cfg.SaveRetry)
		}
		select {
		case <-ctx.Done():
			save()
			p.store.Close()
			return
		case <-changed:
		case <-retry:
		}
		changed = p.store.Changed()
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
// created.
func (p *Proxy) endReload(unit string, sp Space, created int64) {
	gone := p.store.EndReload(sp, created)
	p.log.Info("read the views again from the stream's start", "unit", unit, "space", sp, "seq", p.store.SeqOf(sp), "deleted", gone)
}

// noCursor applies a view without moving its space's cursor.
const noCursor = 0

// consume follows space sp of unit's views from its cursor on with a view
// feed, until ctx is done or the feed fails. The feed finds a rebuilt
// stream (its creation time is not the cursor's, or it ends before the
// cursor) and reads the space again in full: the store's reload
// (reload.go) ends at the catch-up that read it.
func (p *Proxy) consume(ctx context.Context, unit string, sp Space) error {
	filter, err := filterOf(unit, sp)
	if err != nil {
		return err
	}
	if p.store.SeqOf(sp) == 0 && !p.store.Reloading(sp) && p.store.Holds(sp) {
		// Read from the start while holding views (a new unit, or a
		// restart in the middle of reading it): what the read does not
		// bring again goes at its end, not before.
		p.store.BeginReload(sp)
	}
	var created time.Time
	if c := p.store.StreamCreated(sp); c != 0 {
		created = time.Unix(0, c)
	}
	var relay *viewfeed.Relay
	if sp == SharedSpace && p.relay != nil && p.cfg.RelayViews {
		relay = &viewfeed.Relay{Unit: unit, Node: p.host, Key: p.relay.CloudKey, Meshed: p.relay.Meshed, Admit: p.admit}
	}
	feed, err := p.feeds.New(viewfeed.Options{
		Name: "proxy_" + sp.String(), Filter: filter, Start: p.store.SeqOf(sp), Created: created, Relay: relay,
		Apply: func(_ context.Context, m viewfeed.Msg) error {
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
		},
		CaughtUp: func(_ context.Context, c viewfeed.CatchUp) {
			p.store.Advance(sp, c.Verified)
			if p.store.Reloading(sp) {
				p.endReload(unit, sp, c.Created.UnixNano())
			} else {
				p.store.SetStreamCreated(sp, c.Created.UnixNano())
			}
		},
	})
	if err != nil {
		return err
	}
	return feed.Run(ctx)
}
