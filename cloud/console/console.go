package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	corelisters "k8s.io/client-go/listers/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/health"
)

//go:embed assets
var assets embed.FS

// Message is what GET /ui/api/state returns and every SSE event carries
// (event "snapshot" first, then "delta"). A snapshot lists every unit;
// a delta only the units that changed since the client's last message,
// the units that were removed, and the new timeline entries.
type Message struct {
	// Seq increases with every change of the model.
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Units are whole units (Unit), sorted by name.
	Units    []json.RawMessage `json:"units"`
	Removed  []string          `json:"removed,omitempty"`
	Timeline []TimelineEntry   `json:"timeline"`
	// TunnelReplicas is how many replicas answered the last gather of
	// tunnel sessions (-1: none yet).
	TunnelReplicas int `json:"tunnelReplicas"`
}

type unitEntry struct {
	seq  uint64
	unit Unit
	raw  json.RawMessage // unit's JSON, encoded when first sent
}

// encoded is the entry's JSON, encoded once. Callers hold mu.
func (e *unitEntry) encoded() (json.RawMessage, error) {
	if e.raw == nil {
		raw, err := json.Marshal(e.unit)
		if err != nil {
			return nil, fmt.Errorf("console: encode unit %s: %w", e.unit.Name, err)
		}
		e.raw = raw
	}
	return e.raw, nil
}

// Console keeps the page's model and serves the page, the state and the
// event stream.
type Console struct {
	cfg     Config
	b       builder
	tunnels Tunnels // nil: no sessions shown
	log     *slog.Logger
	now     func() time.Time

	sessions atomic.Pointer[map[string]uint32]
	replicas atomic.Int64  // of the last gather; -1 none
	clients  atomic.Int64  // open event streams
	wake     chan struct{} // a browser connected: build now
	umu      sync.Mutex    // one Update at a time
	stop     chan struct{} // closed by Close: the event streams end
	stopOnce sync.Once

	wmu    sync.Mutex
	writes []health.Write // protective writes since the last Update

	mu       sync.Mutex
	seq      uint64
	units    map[string]*unitEntry
	order    []string
	timeline []TimelineEntry // oldest first, at most cfg.Timeline
	tlSeq    uint64          // of the latest timeline entry
	built    bool
	changed  chan struct{} // closed at the next change
}

// New returns a console over the health service h and the Node lister
// nodes; grids (the manager's cache; nil without the grid controllers)
// gives the grids' status, tunnels (nil: none) the tunnel sessions.
func New(cfg Config, h Health, nodes corelisters.NodeLister, grids client.Reader, tunnels Tunnels, log *slog.Logger) (*Console, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case h == nil:
		return nil, errors.New("console: no health service")
	case nodes == nil:
		return nil, errors.New("console: no node lister")
	}
	c := &Console{cfg: cfg, b: builder{health: h, nodes: nodes, grids: grids, rule: cfg.Units},
		tunnels: tunnels, log: log.With("component", "console"), now: time.Now,
		units: map[string]*unitEntry{}, changed: make(chan struct{}), stop: make(chan struct{}), wake: make(chan struct{}, 1)}
	c.replicas.Store(-1)
	return c, nil
}

// SetAgents has each node show the refusals of its probe credentials its
// agent reports. Call it before Run.
func (c *Console) SetAgents(a Agents) { c.b.agents = a }

// SetKeys has each node whose agent reports (SetAgents) show whether the
// cloud holds no key for it. Call it before Run.
func (c *Console) SetKeys(k Keys) { c.b.keys = k }

// Run rebuilds the model every Interval and gathers the tunnel sessions
// every TunnelsEvery until ctx is done; then it ends the event streams
// (Close), so the admin server's graceful shutdown does not wait for
// them.
func (c *Console) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer c.Close()
	defer wg.Wait()
	if c.tunnels != nil {
		wg.Go(func() {
			t := time.NewTicker(c.cfg.TunnelsEvery)
			defer t.Stop()
			var last time.Time
			for {
				// A gather asks every replica: only as often as the
				// model is rebuilt when nobody watches.
				if c.clients.Load() > 0 || time.Since(last) >= c.cfg.IdleInterval {
					last = time.Now()
					if s, n, ok := c.tunnels.GatherTunnels(); ok {
						c.sessions.Store(&s)
						c.replicas.Store(int64(n))
					}
				}
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	for {
		start := time.Now()
		if err := c.Update(ctx); err != nil {
			c.log.Debug("model not built", "err", err)
		}
		interval := c.cfg.Interval
		if c.clients.Load() == 0 {
			interval = c.cfg.IdleInterval
		}
		t := time.NewTimer(nextBuild(interval, time.Since(start)))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		case <-c.wake:
			t.Stop()
		}
	}
}

// woken asks Run for a build now (a browser connected).
func (c *Console) woken() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// nextBuild is the wait before the next rebuild: the interval, or four
// times the last rebuild when that is longer, so the page never takes
// more than about a quarter of a core however many nodes there are.
func nextBuild(interval, took time.Duration) time.Duration {
	return max(interval, 4*took)
}

// Wrote records a protective write of the health service for the
// timeline (health.Service.OnProtectiveWrite); it never blocks for long.
// Writes beyond the timeline's size before the next Update are dropped.
func (c *Console) Wrote(w health.Write) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.writes) < c.cfg.Timeline {
		c.writes = append(c.writes, w)
	}
}

// Update rebuilds the model once; units that changed get a new sequence
// number and wake the event streams, once for the whole rebuild.
func (c *Console) Update(ctx context.Context) error {
	c.umu.Lock()
	defer c.umu.Unlock()
	var sessions map[string]uint32
	if p := c.sessions.Load(); p != nil {
		sessions = *p
	}
	units, err := c.b.units(ctx, sessions)
	if err != nil {
		return err
	}
	now := c.now().UTC()
	c.wmu.Lock()
	writes := c.writes
	c.writes = nil
	c.wmu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := false
	seen := make(map[string]bool, len(units))
	order := make([]string, 0, len(units))
	for _, u := range units {
		seen[u.Name] = true
		order = append(order, u.Name)
		// Compared field by field, and encoded only when a browser is
		// sent the unit: most units do not change between two builds,
		// and nobody may be watching.
		prev := c.units[u.Name]
		if prev != nil && sameUnit(prev.unit, u) {
			continue
		}
		if !changed {
			c.seq++
			changed = true
		}
		if prev != nil && c.built {
			c.record(now, prev.unit, u)
		}
		c.units[u.Name] = &unitEntry{seq: c.seq, unit: u}
	}
	for name := range c.units {
		if !seen[name] {
			delete(c.units, name)
			if !changed {
				c.seq++
				changed = true
			}
		}
	}
	c.order = order
	c.built = true
	if len(writes) > 0 {
		unitOf := map[string]string{}
		for _, u := range units {
			for _, n := range u.Nodes {
				unitOf[n.Name] = u.Name
			}
		}
		for _, w := range writes {
			e := TimelineEntry{Time: w.Time.UTC(), Kind: "write", Detail: "patched " + w.Kind + " " + w.Name}
			if w.Namespace != "" {
				e.Detail = "patched " + w.Kind + " " + w.Namespace + "/" + w.Name
			}
			if w.Kind == "node" {
				e.Node, e.Unit = w.Name, unitOf[w.Name]
			}
			c.append(e)
		}
		if !changed {
			c.seq++
			changed = true
		}
	}
	if changed {
		close(c.changed)
		c.changed = make(chan struct{})
	}
	return nil
}

// record appends the timeline entries of one unit's change; callers
// hold mu.
func (c *Console) record(now time.Time, prev, cur Unit) {
	add := func(e TimelineEntry) {
		e.Time, e.Unit = now, cur.Name
		c.append(e)
	}
	if prev.Disruption != cur.Disruption {
		add(TimelineEntry{Kind: "disruption", From: prev.Disruption, To: cur.Disruption})
	}
	before := make(map[string]Node, len(prev.Nodes))
	for _, n := range prev.Nodes {
		before[n.Name] = n
	}
	for _, n := range cur.Nodes {
		p, ok := before[n.Name]
		if !ok {
			continue
		}
		if p.Verdict != n.Verdict {
			add(TimelineEntry{Kind: "verdict", Node: n.Name, From: p.Verdict, To: n.Verdict, Detail: voters(n.Votes)})
		}
		switch {
		case !p.Protected && n.Protected:
			add(TimelineEntry{Kind: "protected", Node: n.Name, From: p.State, To: n.State,
				Detail: "Kubernetes Ready=" + n.Ready + ", peers say " + n.Verdict + ": Atoll keeps the node and its endpoints"})
		case p.Protected && !n.Protected:
			add(TimelineEntry{Kind: "unprotected", Node: n.Name, From: p.State, To: n.State, Detail: "Ready=" + n.Ready + ", verdict " + n.Verdict})
		case p.State != n.State:
			add(TimelineEntry{Kind: "state", Node: n.Name, From: p.State, To: n.State, Detail: "Ready=" + n.Ready + ", verdict " + n.Verdict})
		}
	}
}

// append adds e to the timeline ring; callers hold mu.
func (c *Console) append(e TimelineEntry) {
	c.tlSeq++
	e.Seq = c.tlSeq
	c.timeline = append(c.timeline, e)
	if len(c.timeline) > c.cfg.Timeline {
		c.timeline = append(c.timeline[:0:0], c.timeline[len(c.timeline)-c.cfg.Timeline:]...)
	}
}

func voters(vs []Vote) string {
	var b bytes.Buffer
	for i, v := range vs {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %s", v.Voter, v.Verdict)
	}
	return b.String()
}

// cursor is what one client has been sent.
type cursor struct {
	seq   uint64          // units up to this sequence
	tl    uint64          // timeline entries up to this sequence
	known map[string]bool // units it has
}

// message builds the message for cur (a snapshot when cur is new) and
// advances it; it returns the channel closed at the next change and
// whether there is anything to send. Callers hold mu.
func (c *Console) message(cur *cursor) (Message, <-chan struct{}, bool) {
	m := Message{Seq: c.seq, Time: c.now().UTC(), Units: []json.RawMessage{}, Timeline: []TimelineEntry{},
		TunnelReplicas: int(c.replicas.Load())}
	snapshot := cur.known == nil
	if snapshot {
		cur.known = map[string]bool{}
	}
	for _, name := range c.order {
		e := c.units[name]
		if e == nil {
			continue
		}
		if snapshot || e.seq > cur.seq || !cur.known[name] {
			raw, err := e.encoded()
			if err != nil {
				c.log.Error("unit left out of the page", "unit", name, "err", err)
				continue
			}
			m.Units = append(m.Units, raw)
		}
	}
	for name := range cur.known {
		if c.units[name] == nil {
			m.Removed = append(m.Removed, name)
			delete(cur.known, name)
		}
	}
	for _, name := range c.order {
		cur.known[name] = true
	}
	for _, e := range c.timeline {
		if snapshot || e.Seq > cur.tl {
			m.Timeline = append(m.Timeline, e)
		}
	}
	if n := len(c.timeline); n > 0 {
		cur.tl = c.timeline[n-1].Seq
	}
	send := snapshot || cur.seq != c.seq || len(m.Units) > 0 || len(m.Removed) > 0 || len(m.Timeline) > 0
	cur.seq = c.seq
	return m, c.changed, send
}

// Snapshot is the whole model now.
func (c *Console) Snapshot() Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, _, _ := c.message(&cursor{})
	return m
}

// Close ends every event stream, open or opened later.
func (c *Console) Close() { c.stopOnce.Do(func() { close(c.stop) }) }

// Clients is the number of open event streams.
func (c *Console) Clients() int { return int(c.clients.Load()) }

// Handler serves the page under /ui/: the page and its assets, the
// state (api/state) and the event stream (api/events).
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	sub, _ := fs.Sub(assets, "assets")
	static := http.StripPrefix("/ui/", http.FileServerFS(sub))
	mux.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	}))
	mux.HandleFunc("GET /ui/api/state", c.serveState)
	mux.HandleFunc("GET /ui/api/events", c.serveEvents)
	return mux
}

func (c *Console) serveState(w http.ResponseWriter, r *http.Request) {
	if c.clients.Load() == 0 {
		// Nobody follows the page: the last build may be IdleInterval
		// old.
		if err := c.Update(r.Context()); err != nil {
			c.log.Debug("model not built", "err", err)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(c.Snapshot())
}

// serveEvents streams the model: a snapshot, then a delta after each
// change, at most one per Interval (changes within it coalesce), and a
// heartbeat comment every Heartbeat. It returns when the client goes
// away (the request's context) or a write fails.
func (c *Console) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	c.clients.Add(1)
	defer c.clients.Add(-1)
	c.woken()
	ctx := r.Context()
	var cur cursor
	send := func(event string) (<-chan struct{}, error) {
		c.mu.Lock()
		m, next, worth := c.message(&cur)
		c.mu.Unlock()
		if !worth {
			return next, nil
		}
		data, err := json.Marshal(m)
		if err != nil {
			return next, err
		}
		if _, err := fmt.Fprintf(w, "event: %s\nid: %d\ndata: %s\n\n", event, m.Seq, data); err != nil {
			return next, err
		}
		return next, rc.Flush()
	}
	next, err := send("snapshot")
	if err != nil {
		return
	}
	hb := time.NewTicker(c.cfg.Heartbeat)
	defer hb.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.stop:
			return
		case <-hb.C:
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-next:
			if next, err = send("delta"); err != nil {
				return
			}
			// Coalesce: what changes in the next Interval goes in one delta.
			gap := time.NewTimer(c.cfg.Interval)
			select {
			case <-ctx.Done():
				gap.Stop()
				return
			case <-c.stop:
				gap.Stop()
				return
			case <-gap.C:
			}
		}
	}
}
