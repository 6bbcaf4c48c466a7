package console

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/atoll-edge/atoll/cloud/health"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/poll"
)

const unitLabel = "atoll.io/unit"

var t0 = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// fakeHealth answers from maps the test changes.
type fakeHealth struct {
	mu        sync.Mutex
	verdicts  map[string]atollv1.Verdict
	protected map[string]bool
	down      map[string]bool
	votes     map[string][]health.Vote
	units     map[string]health.UnitState
}

func newFakeHealth() *fakeHealth {
	return &fakeHealth{verdicts: map[string]atollv1.Verdict{}, protected: map[string]bool{}, down: map[string]bool{},
		votes: map[string][]health.Vote{}, units: map[string]health.UnitState{}}
}

func (f *fakeHealth) Tally(node string) health.Tally {
	f.mu.Lock()
	defer f.mu.Unlock()
	return health.Tally{Verdict: f.verdicts[node]}
}

func (f *fakeHealth) Votes(node string) []health.Vote {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.votes[node]
}

func (f *fakeHealth) UnitState(unit string) (health.UnitState, time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.units[unit]; ok {
		return s, time.Time{}
	}
	return health.Normal, time.Time{}
}

func (f *fakeHealth) Protected(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.protected[node]
}

func (f *fakeHealth) LinkDown(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down[node]
}

func (f *fakeHealth) set(fn func(*fakeHealth)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

type fakeTunnels map[string]uint32

// fakeAgents are the probe refusals each node's agent reports; the nodes
// it names are those whose agents report.
type fakeAgents map[string][]*atollv1.ProbeRefusal

func (a fakeAgents) ProbeRefusals(node string) []*atollv1.ProbeRefusal { return a[node] }

func (a fakeAgents) ViewsBehind(node string) string {
	if _, ok := a[node]; ok {
		return ""
	}
	return "unknown"
}

// fakeKeys are the nodes' valid identity keys.
type fakeKeys map[string]string

func (k fakeKeys) NodeKey(node string) (string, bool) { key, ok := k[node]; return key, ok }

func (t fakeTunnels) GatherTunnels() (map[string]uint32, uint32, bool) { return t, 2, true }

func node(name, unit string, ready corev1.ConditionStatus) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if unit != "" {
		n.Labels[unitLabel] = unit
	}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
	}
	return n
}

func lister(t *testing.T, nodes ...*corev1.Node) (corelisters.NodeLister, cache.Indexer) {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewNodeLister(idx), idx
}

func testConfig() Config {
	c := DefaultConfig()
	c.TunnelsEvery = 50 * time.Millisecond
	return c
}

// fixture: unit u1 with a healthy node a, a node b the cloud lost whose
// peers say healthy (protected), a node c its peers call unhealthy, a
// node d with no Ready condition; unit u2 with one healthy node; a
// control-plane node in no unit.
func fixture(t *testing.T) (*fakeHealth, corelisters.NodeLister, cache.Indexer) {
	h := newFakeHealth()
	h.verdicts["a"] = atollv1.Verdict_VERDICT_HEALTHY
	h.verdicts["b"] = atollv1.Verdict_VERDICT_HEALTHY
	h.verdicts["c"] = atollv1.Verdict_VERDICT_UNHEALTHY
	h.protected["b"] = true
	h.down["b"] = true
	h.votes["b"] = []health.Vote{
		{Voter: "a", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Made: t0, Stored: t0.Add(time.Second)},
		{Voter: "c", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Made: t0, Stored: t0.Add(2 * time.Second)},
	}
	h.units["u1"] = health.PartialDisruption
	l, idx := lister(t, node("a", "u1", corev1.ConditionTrue), node("b", "u1", corev1.ConditionUnknown),
		node("c", "u1", corev1.ConditionUnknown), node("d", "u1", ""), node("e", "u2", corev1.ConditionTrue),
		node("cp", "", corev1.ConditionTrue))
	return h, l, idx
}

func newConsole(t *testing.T, h Health, l corelisters.NodeLister, cfg Config, tunnels Tunnels) *Console {
	t.Helper()
	c, err := New(cfg, h, l, nil, tunnels, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return t0 }
	return c
}

func decodeUnits(t *testing.T, m Message) []Unit {
	t.Helper()
	out := make([]Unit, 0, len(m.Units))
	for _, raw := range m.Units {
		var u Unit
		if err := json.Unmarshal(raw, &u); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func TestModel(t *testing.T) {
	h, l, _ := fixture(t)
	c := newConsole(t, h, l, testConfig(), nil)
	c.sessions.Store(&map[string]uint32{"a": 3})
	c.SetAgents(fakeAgents{"a": {{Plugin: "kubelet-healthz", Peer: "c", Status: "401 Unauthorized"}}})
	c.SetKeys(fakeKeys{"b": "UB"}) // a reports without a key; the others do not report
	if err := c.Update(t.Context()); err != nil {
		t.Fatal(err)
	}
	units := decodeUnits(t, c.Snapshot())
	if len(units) != 2 || units[0].Name != "u1" || units[1].Name != "u2" {
		t.Fatalf("units %+v, want u1 and u2 (the node in no unit left out)", units)
	}
	if units[0].Disruption != "PartialDisruption" || units[1].Disruption != "Normal" {
		t.Fatalf("disruption %q %q", units[0].Disruption, units[1].Disruption)
	}
	tests := []struct {
		node, state, ready, verdict, link string
		protected                         bool
		votes                             int
		tunnels                           uint32
	}{
		{"a", StateHealthy, "True", "healthy", "up", false, 0, 3},
		{"b", StateProtected, "Unknown", "healthy", "down", true, 2, 0},
		{"c", StateUnhealthy, "Unknown", "unhealthy", "up", false, 0, 0},
		{"d", StateUnknown, "", "none", "up", false, 0, 0},
	}
	for i, tt := range tests {
		t.Run(tt.node, func(t *testing.T) {
			n := units[0].Nodes[i]
			if n.Name != tt.node || n.State != tt.state || n.Ready != tt.ready || n.Verdict != tt.verdict ||
				n.Link != tt.link || n.Protected != tt.protected || len(n.Votes) != tt.votes || n.Tunnels != tt.tunnels {
				t.Fatalf("node %+v, want %+v", n, tt)
			}
		})
	}
	a := units[0].Nodes[0]
	if want := []ProbeRefusal{{Plugin: "kubelet-healthz", Peer: "c", Status: "401 Unauthorized"}}; !slices.Equal(a.ProbeRefusals, want) {
		t.Fatalf("a's probe refusals %+v, want %+v", a.ProbeRefusals, want)
	}
	if !a.NoKey {
		t.Fatal("a reports without a key recorded, and does not show it")
	}
	for _, n := range units[0].Nodes[1:] {
		if n.ProbeRefusals != nil || n.NoKey {
			t.Fatalf("%s's probe refusals %+v or no key %v, want none", n.Name, n.ProbeRefusals, n.NoKey)
		}
	}
	b := units[0].Nodes[1]
	if v := b.Votes[1]; v.Voter != "c" || v.Verdict != "healthy" || !v.Made.Equal(t0) || !v.Stored.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("vote %+v", v)
	}
}

func TestNodeState(t *testing.T) {
	tests := []struct {
		name      string
		ready     corev1.ConditionStatus
		verdict   atollv1.Verdict
		protected bool
		want      string
	}{
		{"ready", corev1.ConditionTrue, atollv1.Verdict_VERDICT_NONE, false, StateHealthy},
		{"ready, peers healthy", corev1.ConditionTrue, atollv1.Verdict_VERDICT_HEALTHY, false, StateHealthy},
		{"ready but peers say unhealthy", corev1.ConditionTrue, atollv1.Verdict_VERDICT_UNHEALTHY, false, StateUnhealthy},
		{"lost, protected", corev1.ConditionUnknown, atollv1.Verdict_VERDICT_HEALTHY, true, StateProtected},
		{"lost, held unit without verdict", corev1.ConditionUnknown, atollv1.Verdict_VERDICT_NONE, true, StateProtected},
		{"lost, peers unhealthy", corev1.ConditionUnknown, atollv1.Verdict_VERDICT_UNHEALTHY, false, StateUnhealthy},
		{"lost, nobody says", corev1.ConditionUnknown, atollv1.Verdict_VERDICT_NONE, false, StateUnhealthy},
		{"kubelet says not ready", corev1.ConditionFalse, atollv1.Verdict_VERDICT_HEALTHY, false, StateUnhealthy},
		{"no condition", "", atollv1.Verdict_VERDICT_NONE, false, StateUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nodeState(tt.ready, tt.verdict, tt.protected); got != tt.want {
				t.Fatalf("nodeState = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestGrids: the grids' status, read through a client.Reader (the
// manager's cache in the app), gives each unit its child's revision
// against the rollout's and its place in the rollout.
func TestGrids(t *testing.T) {
	h, l, _ := fixture(t)
	scheme := clientgoscheme.Scheme
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	g := &appsv1alpha1.DeploymentGrid{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
		Status: appsv1alpha1.GridStatus{
			Units: []appsv1alpha1.UnitStatus{
				{Name: "u1", Revision: "new-u1", Replicas: 2, ReadyReplicas: 1},
				{Name: "u2", Revision: "old-u2", Replicas: 2, ReadyReplicas: 2, Ready: true},
			},
			Rollout: &appsv1alpha1.RolloutStatus{Revision: "spec2", Updated: []string{"u1"}, Pending: []string{"u2"}},
		}}
	r := fake.NewClientBuilder().WithScheme(scheme).WithObjects(g).Build()
	c, err := New(testConfig(), h, l, r, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Update(t.Context()); err != nil {
		t.Fatal(err)
	}
	units := decodeUnits(t, c.Snapshot())
	want := map[string]GridUnit{
		"u1": {Grid: "DeploymentGrid/ns/web", Revision: "new-u1", Rollout: "spec2", Current: true, ReadyReplicas: 1, Replicas: 2, Phase: "updated", Position: 1, Of: 2},
		"u2": {Grid: "DeploymentGrid/ns/web", Revision: "old-u2", Rollout: "spec2", Ready: true, ReadyReplicas: 2, Replicas: 2, Phase: "pending", Position: 2, Of: 2},
	}
	for _, u := range units {
		if len(u.Grids) != 1 || u.Grids[0] != want[u.Name] {
			t.Fatalf("unit %s grids %+v, want %+v", u.Name, u.Grids, want[u.Name])
		}
	}
}

// TestTimeline: a change of verdict and of protection is recorded once,
// with its unit and node; nothing is recorded when nothing changes, nor
// for the first build (the baseline); the ring keeps the latest entries.
func TestTimeline(t *testing.T) {
	h, l, _ := fixture(t)
	cfg := testConfig()
	cfg.Timeline = 3
	c := newConsole(t, h, l, cfg, nil)
	ctx := t.Context()
	for range 2 {
		if err := c.Update(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if tl := c.Snapshot().Timeline; len(tl) != 0 {
		t.Fatalf("timeline after two unchanged builds: %+v", tl)
	}
	seq := c.Snapshot().Seq
	h.set(func(f *fakeHealth) {
		f.verdicts["a"] = atollv1.Verdict_VERDICT_UNHEALTHY
		f.protected["c"] = true
		f.verdicts["c"] = atollv1.Verdict_VERDICT_HEALTHY
		f.units["u1"] = health.FullDisruption
	})
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	m := c.Snapshot()
	if m.Seq != seq+1 {
		t.Fatalf("seq %d after one changed build, want %d", m.Seq, seq+1)
	}
	var got []string
	for _, e := range m.Timeline {
		got = append(got, fmt.Sprintf("%s %s %s→%s", e.Kind, e.Node, e.From, e.To))
	}
	// Five entries (the disruption, a's verdict and colour, c's verdict
	// and protection): the ring holds the latest 3.
	want := []string{"state a healthy→unhealthy", "verdict c unhealthy→healthy", "protected c unhealthy→protected"}
	if !slices.Equal(got, want) {
		t.Fatalf("timeline %q, want %q", got, want)
	}
	h.set(func(f *fakeHealth) { f.verdicts["a"] = atollv1.Verdict_VERDICT_HEALTHY })
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	last := c.Snapshot().Timeline
	if e := last[len(last)-1]; e.Kind != "state" || e.Node != "a" || e.Seq != m.Timeline[2].Seq+2 {
		t.Fatalf("latest entry %+v", e)
	}
}

// sse reads server-sent events.
type sse struct {
	r *bufio.Reader
}

type event struct {
	name, data string
	comment    bool
}

func (s *sse) next() (event, error) {
	var ev event
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.name != "" || ev.comment {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
			ev.comment = true
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
}

func (s *sse) message(t *testing.T, name string) Message {
	t.Helper()
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.comment {
			continue
		}
		if ev.name != name {
			t.Fatalf("event %q, want %q", ev.name, name)
		}
		var m Message
		if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
}

func stream(t *testing.T, ctx context.Context, url string) (*sse, func()) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/ui/api/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	return &sse{r: bufio.NewReader(resp.Body)}, func() { _ = resp.Body.Close() }
}

// TestEvents: a stream starts with a snapshot of every unit, then sends
// deltas naming only the units that changed and the new timeline entries;
// a burst of changes within one interval arrives as one delta.
func TestEvents(t *testing.T) {
	h, l, _ := fixture(t)
	cfg := testConfig()
	cfg.Interval = time.Second
	c := newConsole(t, h, l, cfg, nil)
	ctx := t.Context()
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	s, closeStream := stream(t, ctx, srv.URL)
	defer closeStream()
	snap := s.message(t, "snapshot")
	if u := decodeUnits(t, snap); len(u) != 2 {
		t.Fatalf("snapshot of %d units, want 2", len(u))
	}

	h.set(func(f *fakeHealth) { f.verdicts["e"] = atollv1.Verdict_VERDICT_UNHEALTHY })
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	d := s.message(t, "delta")
	if u := decodeUnits(t, d); len(u) != 1 || u[0].Name != "u2" || u[0].Nodes[0].State != StateUnhealthy {
		t.Fatalf("delta units %+v, want u2 alone with e unhealthy", u)
	}
	if len(d.Timeline) != 2 || d.Timeline[0].Node != "e" {
		t.Fatalf("delta timeline %+v, want e's verdict and state", d.Timeline)
	}

	// A burst: five changes, each its own rebuild, within the interval
	// that follows the delta just sent.
	for i := range 5 {
		h.set(func(f *fakeHealth) {
			f.verdicts["e"] = []atollv1.Verdict{atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY}[i%2]
			f.down["a"] = i%2 == 0
		})
		if err := c.Update(ctx); err != nil {
			t.Fatal(err)
		}
	}
	d = s.message(t, "delta")
	units := decodeUnits(t, d)
	if len(units) != 2 || len(d.Timeline) != 10 {
		t.Fatalf("coalesced delta: %d units, %d timeline entries; want both units, the 10 entries of the burst", len(units), len(d.Timeline))
	}
	if units[1].Nodes[0].Verdict != "healthy" || units[0].Nodes[0].Link != "down" {
		t.Fatalf("coalesced delta does not carry the latest state: %+v", units)
	}
}

// TestHeartbeat: an idle stream carries heartbeat comments.
func TestHeartbeat(t *testing.T) {
	h, l, _ := fixture(t)
	cfg := testConfig()
	cfg.Heartbeat = 50 * time.Millisecond
	c := newConsole(t, h, l, cfg, nil)
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	s, closeStream := stream(t, t.Context(), srv.URL)
	defer closeStream()
	s.message(t, "snapshot")
	for range 2 {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		if !ev.comment {
			t.Fatalf("event %+v on an idle stream, want a heartbeat comment", ev)
		}
	}
}

// TestNoLeakOnDisconnect: clients that go away (and a Close) end their
// streams' handlers; no goroutine is left behind.
func TestNoLeakOnDisconnect(t *testing.T) {
	h, l, _ := fixture(t)
	c := newConsole(t, h, l, testConfig(), fakeTunnels{"a": 1})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = c.Run(ctx); close(done) }()
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	base := runtime.NumGoroutine()

	var closers []func()
	for range 20 {
		s, closeStream := stream(t, t.Context(), srv.URL)
		s.message(t, "snapshot")
		closers = append(closers, closeStream)
	}
	if n := c.Clients(); n != 20 {
		t.Fatalf("%d clients, want 20", n)
	}
	for _, f := range closers[:10] {
		f()
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if n := c.Clients(); n != 10 {
			return fmt.Errorf("%d clients after 10 disconnected, want 10", n)
		}
		return nil
	})
	// The rest end when the console stops (the app's shutdown).
	cancel()
	<-done
	poll.Eventually(t, 10*time.Second, func() error {
		if n := c.Clients(); n != 0 {
			return fmt.Errorf("%d clients after Close, want 0", n)
		}
		return nil
	})
	for _, f := range closers[10:] {
		f()
	}
	http.DefaultClient.CloseIdleConnections()
	srv.CloseClientConnections()
	poll.Eventually(t, 10*time.Second, func() error {
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Errorf("%d goroutines, %d before the streams", n, base)
		}
		return nil
	})
}

// TestPage: the page and its assets are embedded and served with a
// policy that loads nothing from elsewhere; the state is JSON.
func TestPage(t *testing.T) {
	h, l, _ := fixture(t)
	c := newConsole(t, h, l, testConfig(), nil)
	if err := c.Update(t.Context()); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	get := func(path string) (*http.Response, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, body := get("/ui/")
	if resp.StatusCode != 200 || !strings.Contains(body, `<script src="app.js">`) ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") {
		t.Fatalf("GET /ui/: %d %q CSP %q", resp.StatusCode, body[:min(len(body), 80)], resp.Header.Get("Content-Security-Policy"))
	}
	for _, a := range []string{"/ui/app.js", "/ui/style.css"} {
		if resp, _ := get(a); resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d", a, resp.StatusCode)
		}
	}
	resp, body = get("/ui/api/state")
	var m Message
	if err := json.Unmarshal([]byte(body), &m); err != nil || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("state: %v %q", err, body)
	}
	if len(m.Units) != 2 || m.TunnelReplicas != -1 {
		t.Fatalf("state %+v", m)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"interval", func(c *Config) { c.Interval = 100 * time.Millisecond }, "interval"},
		{"tunnels", func(c *Config) { c.TunnelsEvery = 0 }, "tunnels interval"},
		{"heartbeat", func(c *Config) { c.Heartbeat = 0 }, "heartbeat"},
		{"timeline", func(c *Config) { c.Timeline = 0 }, "timeline"},
		{"unit label", func(c *Config) { c.Units.Label = "" }, "unit label"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			tt.edit(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("Validate = %v, want an error naming %q", err, tt.field)
			}
		})
	}
	if err := testConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestWrites: the health service's protective writes enter the timeline
// at the next rebuild, a Node's with its unit, and wake the streams even
// when no unit changed.
func TestWrites(t *testing.T) {
	h, l, _ := fixture(t)
	c := newConsole(t, h, l, testConfig(), nil)
	ctx := t.Context()
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	seq := c.Snapshot().Seq
	c.Wrote(health.Write{Kind: "node", Name: "b", Time: t0})
	c.Wrote(health.Write{Kind: "endpointslice", Namespace: "web", Name: "web-abc", Time: t0})
	if err := c.Update(ctx); err != nil {
		t.Fatal(err)
	}
	m := c.Snapshot()
	if m.Seq != seq+1 || len(m.Timeline) != 2 {
		t.Fatalf("seq %d (was %d), timeline %+v", m.Seq, seq, m.Timeline)
	}
	if e := m.Timeline[0]; e.Kind != "write" || e.Node != "b" || e.Unit != "u1" || e.Detail != "patched node b" {
		t.Fatalf("node write entry %+v", e)
	}
	if e := m.Timeline[1]; e.Kind != "write" || e.Node != "" || e.Detail != "patched endpointslice web/web-abc" {
		t.Fatalf("slice write entry %+v", e)
	}
}

// BenchmarkUpdate rebuilds the model of UNITS×NODES nodes (fake health;
// the cost of reading the cache and comparing with the last build), the
// work of every Interval. Figures: docs/benchmarks.md.
func BenchmarkUpdate(b *testing.B) {
	for _, size := range []struct{ units, nodes int }{{10, 10}, {100, 50}, {200, 50}} {
		b.Run(fmt.Sprintf("units=%d/nodes=%d", size.units, size.nodes), func(b *testing.B) {
			h := newFakeHealth()
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			for u := range size.units {
				for n := range size.nodes {
					name := fmt.Sprintf("u%d-%d", u, n)
					h.verdicts[name] = atollv1.Verdict_VERDICT_HEALTHY
					h.votes[name] = []health.Vote{{Voter: "x", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Made: t0, Stored: t0}}
					if err := idx.Add(node(name, fmt.Sprintf("u%d", u), corev1.ConditionTrue)); err != nil {
						b.Fatal(err)
					}
				}
			}
			c, err := New(testConfig(), h, corelisters.NewNodeLister(idx), nil, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Update(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestNextBuild(t *testing.T) {
	for _, tt := range []struct{ interval, took, want time.Duration }{
		{250 * time.Millisecond, time.Millisecond, 250 * time.Millisecond},
		{250 * time.Millisecond, 100 * time.Millisecond, 400 * time.Millisecond},
	} {
		if got := nextBuild(tt.interval, tt.took); got != tt.want {
			t.Fatalf("nextBuild(%s, %s) = %s, want %s", tt.interval, tt.took, got, tt.want)
		}
	}
}

// countingHealth counts the model builds (one Judge per node per build).
type countingHealth struct {
	*fakeHealth
	judged atomic.Int64
}

func (c *countingHealth) Tally(node string) health.Tally {
	c.judged.Add(1)
	return c.fakeHealth.Tally(node)
}

// TestIdleRebuilds: with no browser following the page, Run rebuilds at
// IdleInterval, not Interval; a browser that connects gets a build at
// once and the fast cadence while it stays.
func TestIdleRebuilds(t *testing.T) {
	fh, l, _ := fixture(t)
	h := &countingHealth{fakeHealth: fh}
	cfg := testConfig()
	cfg.Interval, cfg.IdleInterval = 250*time.Millisecond, time.Hour
	c := newConsole(t, h, l, cfg, nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	poll.Eventually(t, 10*time.Second, func() error {
		if h.judged.Load() == 0 {
			return poll.Errorf("no first build")
		}
		return nil
	})
	first := h.judged.Load()
	// Several fast intervals: an idle console must not have rebuilt. (A
	// wait is the assertion here: nothing is supposed to happen.)
	time.Sleep(4 * cfg.Interval)
	if n := h.judged.Load(); n != first {
		t.Fatalf("idle console rebuilt: %d tallies after the first build's %d", n, first)
	}

	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	_, closeStream := stream(t, ctx, srv.URL)
	defer closeStream()
	poll.Eventually(t, 10*time.Second, func() error {
		if n := h.judged.Load(); n < first+2*(first) {
			return poll.Errorf("%d tallies, want builds at the fast interval once a browser follows", n)
		}
		return nil
	})
}

// TestSameUnit changes every field of a unit, of its node, of the node's
// vote and of its grid one at a time: each change must make the unit
// differ (a field sameUnit does not compare would never reach the page).
func TestSameUnit(t *testing.T) {
	hold := t0.Add(time.Minute)
	base := Unit{Name: "u1", Disruption: "Normal", HoldUntil: &hold,
		Nodes: []Node{{Name: "a", State: StateHealthy, Ready: "True", Verdict: "healthy", Protected: true, Link: "up", Tunnels: 1,
			Votes:         []Vote{{Voter: "b", Verdict: "healthy", Made: t0, Stored: t0}},
			ProbeRefusals: []ProbeRefusal{{Plugin: "kubelet-healthz", Peer: "b", Status: "401 Unauthorized"}}}},
		Grids: []GridUnit{{Grid: "DeploymentGrid/ns/web", Revision: "r1", Rollout: "r2", Current: true, Ready: true,
			ReadyReplicas: 1, Replicas: 2, Phase: "updated", Position: 1, Of: 2}}}
	clone := func() Unit {
		raw, err := json.Marshal(base)
		if err != nil {
			t.Fatal(err)
		}
		var u Unit
		if err := json.Unmarshal(raw, &u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	if !sameUnit(base, clone()) {
		t.Fatal("a unit differs from its copy")
	}
	// leaves lists the settable leaf fields under v by path.
	var leaves func(path string, v reflect.Value, out map[string]bool)
	leaves = func(path string, v reflect.Value, out map[string]bool) {
		switch {
		case v.Type() == reflect.TypeFor[time.Time]() || v.Type() == reflect.TypeFor[*time.Time]():
			out[path] = true
		case v.Kind() == reflect.Struct:
			for i := range v.NumField() {
				leaves(path+"."+v.Type().Field(i).Name, v.Field(i), out)
			}
		case v.Kind() == reflect.Slice:
			leaves(path+"[0]", v.Index(0), out)
		default:
			out[path] = true
		}
	}
	paths := map[string]bool{}
	leaves("Unit", reflect.ValueOf(base), paths)
	// field follows path from the unit u.
	field := func(u reflect.Value, path string) reflect.Value {
		v := u
		for _, part := range strings.Split(path, ".")[1:] {
			name, idx := strings.CutSuffix(part, "[0]")
			v = v.FieldByName(name)
			if idx {
				v = v.Index(0)
			}
		}
		return v
	}
	for path := range paths {
		u := clone()
		f := field(reflect.ValueOf(&u).Elem(), path)
		switch x := f.Addr().Interface().(type) {
		case *string:
			*x += "x"
		case *bool:
			*x = !*x
		case *int:
			*x++
		case *int32:
			*x++
		case *uint32:
			*x++
		case *time.Time:
			*x = x.Add(time.Second)
		case **time.Time:
			later := (*x).Add(time.Second)
			*x = &later
		default:
			t.Fatalf("%s: the test cannot change a %s", path, f.Type())
		}
		if sameUnit(base, u) {
			t.Errorf("%s changed, sameUnit still says equal", path)
		}
	}
	if len(paths) < 24 {
		t.Fatalf("only %d fields walked", len(paths))
	}
	// A unit without hold and one with.
	u := clone()
	u.HoldUntil = nil
	if sameUnit(base, u) || sameUnit(u, base) || !sameUnit(u, u) {
		t.Fatal("hold nil vs set")
	}
}
