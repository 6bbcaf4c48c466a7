package prober

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// peer is a fake node on its own loopback address: a TCP port and an HTTP
// /healthz that can be made to fail.
type peer struct {
	ip      string
	port    int
	healthy bool
	mu      sync.Mutex
}

func newPeer(t *testing.T, ip string) *peer {
	t.Helper()
	p := &peer{ip: ip, healthy: true}
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	p.port = ln.Addr().(*net.TCPAddr).Port
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		ok := p.healthy
		p.mu.Unlock()
		if r.URL.Path != "/healthz" || !ok {
			http.Error(w, "unhealthy", http.StatusInternalServerError)
			return
		}
		if r.Header.Get("Authorization") != "Bearer s3cret" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	_ = srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return p
}

func (p *peer) setHealthy(ok bool) { p.mu.Lock(); p.healthy = ok; p.mu.Unlock() }

type fixed membership.View

func (f fixed) Current() membership.View { return membership.View(f) }

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no plugins", func(c *Config) { c.Plugins = nil }, "no check plugins"},
		{"zero weight", func(c *Config) { c.Plugins[0].Weight = 0 }, "weight"},
		{"timeout above period", func(c *Config) { c.Plugins[0].Timeout = time.Minute }, "timeout"},
		{"unreachable scoreline", func(c *Config) { c.Scoreline = 101 }, "scoreline"},
		{"duplicate names", func(c *Config) { c.Plugins[1].Name = c.Plugins[0].Name }, "used twice"},
		{"no period", func(c *Config) { c.Period = 0 }, "period"},
		{"no parallelism", func(c *Config) { c.Parallelism = 0 }, "parallelism"},
		{"flood", func(c *Config) { c.Parallelism = 5000 }, "parallelism"},
		{"no budget", func(c *Config) { c.RoundBudget = 0 }, "round budget"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			c.Plugins = append([]PluginConfig(nil), ok.Plugins...)
			tt.mutate(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error about %q", err, tt.want)
			}
		})
	}
	if err := ok.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if _, err := New(Config{Period: time.Second, RoundBudget: 2 * time.Second, Scoreline: 50, Parallelism: 1, Plugins: []PluginConfig{{Kind: "icmp", Weight: 1, Timeout: time.Second}}}, "a", fixed{}, nil, testSigner(t), slog.Default(), nil); err == nil || !strings.Contains(err.Error(), "unknown kind") {
		t.Fatalf("unknown plugin kind: %v", err)
	}
	if _, err := New(ok, "a", fixed{}, nil, nil, slog.Default(), nil); err == nil || !strings.Contains(err.Error(), "signer") {
		t.Fatalf("no signer: %v", err)
	}
}

func testSigner(t *testing.T) nkeys.KeyPair {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestRound: a round scores every member with real TCP and HTTP checks and
// publishes the report on the node's probe subject, signed with the node's
// identity key.
func TestRound(t *testing.T) {
	peers := map[string]*peer{"a": newPeer(t, "127.0.0.1"), "b": newPeer(t, "127.0.0.2"), "c": newPeer(t, "127.0.0.3")}
	tokenFile := t.TempDir() + "/token"
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	view := membership.View{Unit: "u1"}
	for name, p := range peers {
		view.Members = append(view.Members, &atollv1.UnitMember{Name: name, InternalIp: p.ip})
	}
	// Route each target to its own port with a tiny plugin wrapper.
	Register("test-port", func(c PluginConfig) (Plugin, error) {
		return portByIP{kind: c.Scheme, peers: peers, token: tokenFile}, nil
	})
	cfg := Config{Period: time.Second, RoundBudget: 3 * time.Second, Scoreline: 100, Parallelism: 4, Plugins: []PluginConfig{
		{Kind: "test-port", Name: "tcp", Scheme: "tcp", Weight: 0.5, Timeout: 500 * time.Millisecond},
		{Kind: "test-port", Name: "http", Scheme: "http", Weight: 0.5, Timeout: 500 * time.Millisecond, Retries: 2},
	}}

	h := natstest.Hub(t)
	nodes := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a")
	nc, err := nodes[0].Connect("prober")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	got := make(chan *atollv1.ProbeReport, 10)
	if _, err := eventbus.Subscribe(nc, "atoll.health.probe.u1.a", "test", func(_ context.Context, ev eventbus.Event[*atollv1.ProbeReport]) error {
		if err := events.Verify(ev.Subject, ev.Header, ev.Data, nodes[0].PublicKey()); err != nil {
			return err // not sent on got: the test fails
		}
		got <- ev.Msg
		return nil
	}, eventbus.ConsumeOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, "a", fixed(view), hublink.Of(nc, nil), nodes[0], natstest.Logger(t, slog.LevelWarn), nil)
	if err != nil {
		t.Fatal(err)
	}

	peers["c"].setHealthy(false)
	if err := p.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	var r *atollv1.ProbeReport
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no report published")
	}
	if r.GetChecker() != "a" || r.GetUnit() != "u1" || r.GetSequence() != 1 || len(r.GetPeers()) != 3 {
		t.Fatalf("report = %v", r)
	}
	for _, res := range r.GetPeers() {
		switch res.GetNode() {
		case "a", "b":
			if !res.GetNormal() || res.GetScore() != 100 || len(res.GetPlugins()) != 0 {
				t.Errorf("%s: %v, want normal with score 100 and no details", res.GetNode(), res)
			}
		case "c":
			if res.GetNormal() || res.GetScore() != 50 || len(res.GetPlugins()) != 2 {
				t.Fatalf("c: %v, want abnormal with score 50 and details", res)
			}
			httpRes := res.GetPlugins()[1]
			if httpRes.GetOk() || httpRes.GetAttempts() != 3 || !strings.Contains(httpRes.GetError(), "500") {
				t.Errorf("c http: %v, want 3 failed attempts with the status", httpRes)
			}
		}
	}
	if rtts := p.RTTs(); len(rtts) != 2 {
		t.Errorf("RTTs = %v, want b and c", rtts)
	}

	// A node in no unit checks nobody.
	p.members = fixed(membership.View{})
	if err := p.Round(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		t.Fatalf("a node in no unit published %v", r)
	default:
	}
}

// portByIP dispatches to the built-in plugins with each peer's own port.
type portByIP struct {
	kind  string
	peers map[string]*peer
	token string
}

func (p portByIP) Check(ctx context.Context, t Target) error {
	for _, pe := range p.peers {
		if pe.ip != t.IP {
			continue
		}
		var pl Plugin
		var err error
		if p.kind == "tcp" {
			pl, err = newTCP(PluginConfig{Name: "tcp", Port: pe.port})
		} else {
			pl, err = newHTTP(PluginConfig{Name: "http", Port: pe.port, Scheme: "http", TokenFile: p.token})
		}
		if err != nil {
			return err
		}
		return pl.Check(ctx, t)
	}
	return fmt.Errorf("no peer at %s", t.IP)
}
