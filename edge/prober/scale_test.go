package prober

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// bigUnit is a unit of real loopback targets, each on its own address
// (127.0.0.1 … 127.0.0.n) and the same port, serving /healthz over HTTP.
// Every hung-th target is black-holed: its /healthz never answers.
type bigUnit struct {
	port int
	view membership.View
	hung map[string]bool
}

func newBigUnit(t *testing.T, n, hung int) *bigUnit {
	t.Helper()
	u := &bigUnit{view: membership.View{Unit: "u1"}, hung: map[string]bool{}}
	handler := func(blackHole bool) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if blackHole {
				<-r.Context().Done()
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
	}
	var lns []net.Listener
	for attempt := 0; ; attempt++ {
		lns = lns[:0]
		first, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, first)
		u.port = first.Addr().(*net.TCPAddr).Port
		for i := 2; i <= n; i++ {
			ln, err := net.Listen("tcp", "127.0.0.1"[:8]+strconv.Itoa(i)+":"+strconv.Itoa(u.port))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) == n {
			break
		}
		for _, ln := range lns {
			_ = ln.Close()
		}
		if attempt == 5 {
			t.Fatal("no port free on all loopback addresses")
		}
	}
	for i, ln := range lns {
		name := fmt.Sprintf("m%03d", i)
		blackHole := hung > 0 && i%hung == hung-1
		u.hung[name] = blackHole
		srv := &http.Server{Handler: handler(blackHole), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		u.view.Members = append(u.view.Members, &atollv1.UnitMember{Name: name, InternalIp: ln.Addr().(*net.TCPAddr).IP.String()})
	}
	return u
}

// counting wraps the built-in plugins and records how many checks run at
// once across all targets.
type counting struct {
	inner     Plugin
	now, peak *atomic.Int64
}

func (c counting) Check(ctx context.Context, t Target) error {
	n := c.now.Add(1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			break
		}
	}
	defer c.now.Add(-1)
	return c.inner.Check(ctx, t)
}

var (
	inFlight, inFlightPeak atomic.Int64
	registerCounting       sync.Once
)

// config is a prober config whose plugins check u's targets over plain
// HTTP and TCP, counting checks in flight.
func (u *bigUnit) config(base Config) Config {
	registerCounting.Do(func() {
		for _, kind := range []string{"tcp", "http"} {
			Register("counted-"+kind, func(c PluginConfig) (Plugin, error) {
				c.Kind = kind
				inner, err := build(c)
				if err != nil {
					return nil, err
				}
				return counting{inner: inner, now: &inFlight, peak: &inFlightPeak}, nil
			})
		}
	})
	cfg := base
	cfg.Plugins = nil
	for _, p := range base.Plugins {
		p.Kind, p.Port, p.Scheme, p.InsecureSkipVerify = "counted-"+p.Kind, u.port, "http", false
		cfg.Plugins = append(cfg.Plugins, p)
	}
	return cfg
}

// runRound runs one round of a prober of u with cfg and returns its report
// and stats.
func (u *bigUnit) runRound(t *testing.T, cfg Config, log *slog.Logger, rounds int) (*Prober, *atollv1.ProbeReport) {
	t.Helper()
	h := natstest.Hub(t)
	nc, err := h.Connect("prober")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got := make(chan *atollv1.ProbeReport, rounds)
	if _, err := eventbus.Subscribe(nc, "atoll.health.probe.u1.m000", "test", func(_ context.Context, ev eventbus.Event[*atollv1.ProbeReport]) error { got <- ev.Msg; return nil }, eventbus.ConsumeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, "m000", fixed(u.view), hublink.Of(nc, nil), testSigner(t), log, newMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	inFlightPeak.Store(0)
	var r *atollv1.ProbeReport
	for i := range rounds {
		if err := p.Round(context.Background()); err != nil {
			t.Fatal(err)
		}
		if d := p.LastRound().Duration; d > cfg.RoundBudget {
			t.Fatalf("round %d took %v, more than the budget %v", i, d, cfg.RoundBudget)
		}
		select {
		case r = <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("no report published")
		}
	}
	return p, r
}

// checkVerdicts fails on a reported member whose result is not what its
// target is: abnormal iff black-holed.
func (u *bigUnit) checkVerdicts(t *testing.T, r *atollv1.ProbeReport) {
	t.Helper()
	for _, res := range r.GetPeers() {
		if res.GetNormal() == u.hung[res.GetNode()] {
			t.Errorf("%s: normal = %v, black-holed = %v: %v", res.GetNode(), res.GetNormal(), u.hung[res.GetNode()], res)
		}
	}
}

// TestRoundOfHundredMembersFitsBudget: with the default settings, a unit of
// 100 members, one in five black-holed, is checked completely within the
// round budget, which is half the voter's default freshness window.
func TestRoundOfHundredMembersFitsBudget(t *testing.T) {
	def := DefaultConfig()
	if fresh := voter.DefaultConfig().Timeout; def.RoundBudget > fresh/2 {
		t.Fatalf("default round budget %v exceeds half the voter's freshness window %v", def.RoundBudget, fresh)
	}
	u := newBigUnit(t, 100, 5)
	cfg := u.config(def)
	p, r := u.runRound(t, cfg, natstest.Logger(t, slog.LevelWarn), 2)
	st := p.LastRound()
	if !st.Fits || st.Members != 100 || st.Checked != 100 || len(r.GetPeers()) != 100 {
		t.Fatalf("round = %+v with %d results, want all 100 members checked", st, len(r.GetPeers()))
	}
	u.checkVerdicts(t, r)
	if peak := inFlightPeak.Load(); peak > int64(st.Workers) || st.Workers > cfg.Parallelism {
		t.Errorf("%d checks at once with %d workers and parallelism %d", peak, st.Workers, cfg.Parallelism)
	}
	t.Logf("round %v with %d workers, %d checks at most in flight", st.Duration, st.Workers, inFlightPeak.Load())
}

// TestRoundConcurrencyIsBounded: with a lower parallelism the prober picks
// the fewest workers that fit the worst case, never more checks at once.
func TestRoundConcurrencyIsBounded(t *testing.T) {
	u := newBigUnit(t, 100, 5)
	base := DefaultConfig()
	base.Parallelism = 40
	for i := range base.Plugins {
		base.Plugins[i].Timeout = 200 * time.Millisecond // 0.8 s a member at worst: 3 a worker
	}
	cfg := u.config(base)
	p, r := u.runRound(t, cfg, natstest.Logger(t, slog.LevelWarn), 2)
	st := p.LastRound()
	if want, _ := cfg.workers(100); st.Workers != want || want != 34 {
		t.Fatalf("workers = %d, want %d (= 34)", st.Workers, want)
	}
	if !st.Fits || st.Checked != 100 {
		t.Fatalf("round = %+v, want all 100 members checked", st)
	}
	u.checkVerdicts(t, r)
	if peak := inFlightPeak.Load(); peak > int64(st.Workers) {
		t.Errorf("%d checks at once, bound %d", peak, st.Workers)
	}
	if peak := inFlightPeak.Load(); peak < 2 {
		t.Errorf("checks never overlapped (peak %d): the test proves nothing", peak)
	}
}

// TestRoundThatCannotFitSaysSo: when the parallelism cannot fit the worst
// case in the budget, the prober warns once, reports it in its metrics,
// still ends the round within the budget, and leaves the members it could
// not check out of the report instead of calling them abnormal.
func TestRoundThatCannotFitSaysSo(t *testing.T) {
	u := newBigUnit(t, 100, 5)
	base := DefaultConfig()
	base.Parallelism = 4
	base.RoundBudget = time.Second
	for i := range base.Plugins {
		base.Plugins[i].Timeout = 200 * time.Millisecond
	}
	cfg := u.config(base)
	var logs bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	p, r := u.runRound(t, cfg, log, 3)
	st := p.LastRound()
	if st.Fits || st.Workers != 4 {
		t.Fatalf("round = %+v, want 4 workers, not fitting", st)
	}
	if st.Checked >= st.Members || st.Checked == 0 || len(r.GetPeers()) != st.Checked {
		t.Fatalf("round = %+v with %d results, want some but not all members checked", st, len(r.GetPeers()))
	}
	u.checkVerdicts(t, r)
	if peak := inFlightPeak.Load(); peak > 4 {
		t.Errorf("%d checks at once, bound 4", peak)
	}
	if got := gaugeValue(t, p.metrics.fits); got != 0 {
		t.Errorf("round_fits_budget = %v, want 0", got)
	}
	if got := counterValue(t, p.metrics.unchecked); got < float64(st.Members-st.Checked) {
		t.Errorf("members_unchecked_total = %v, want at least %d", got, st.Members-st.Checked)
	}
	mu.Lock()
	warnings := strings.Count(logs.String(), "may not fit its budget")
	mu.Unlock()
	if warnings != 1 {
		t.Errorf("%d warnings over 3 rounds, want 1:\n%s", warnings, logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestWorkers: the fewest workers that fit the worst case, capped by the
// parallelism; a member whose worst case alone exceeds the budget never
// fits.
func TestWorkers(t *testing.T) {
	base := DefaultConfig() // 2 s a member at worst, 2.8 s for checks
	tests := []struct {
		name        string
		mutate      func(*Config)
		members     int
		wantWorkers int
		wantFits    bool
	}{
		{"empty unit", nil, 0, 0, true},
		{"one member", nil, 1, 1, true},
		{"hundred members, one each", nil, 100, 100, true},
		{"more than the parallelism", nil, 200, 128, false},
		{"short timeouts share workers", func(c *Config) {
			c.Plugins[0].Timeout, c.Plugins[1].Timeout = 100*time.Millisecond, 100*time.Millisecond
		}, 100, 15, true},
		{"one member exceeds the budget", func(c *Config) { c.Plugins[0].Retries = 5 }, 3, 3, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base
			c.Plugins = append([]PluginConfig(nil), base.Plugins...)
			if tt.mutate != nil {
				tt.mutate(&c)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			w, fits := c.workers(tt.members)
			if w != tt.wantWorkers || fits != tt.wantFits {
				t.Fatalf("workers(%d) = %d, %v; want %d, %v", tt.members, w, fits, tt.wantWorkers, tt.wantFits)
			}
		})
	}
}

// TestRoundSkipsWhatCannotMatter: once a member cannot reach the
// scoreline, its remaining plugins are skipped (it is abnormal anyway).
func TestRoundSkipsWhatCannotMatter(t *testing.T) {
	u := newBigUnit(t, 2, 0)
	// A third member on an address where nothing listens: its TCP check
	// is refused at once.
	u.view.Members = append(u.view.Members, &atollv1.UnitMember{Name: "gone", InternalIp: "127.0.0.250"})
	cfg := u.config(DefaultConfig())
	_, r := u.runRound(t, cfg, natstest.Logger(t, slog.LevelWarn), 1)
	for _, res := range r.GetPeers() {
		if res.GetNode() != "gone" {
			if !res.GetNormal() {
				t.Errorf("%s: %v, want normal", res.GetNode(), res)
			}
			continue
		}
		pl := res.GetPlugins()
		if res.GetNormal() || len(pl) != 2 || pl[0].GetOk() || pl[1].GetAttempts() != 0 || !strings.Contains(pl[1].GetError(), "skipped") {
			t.Errorf("gone: %v, want abnormal with the second plugin skipped", res)
		}
	}
}
