package agent_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/admin"

	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nkeys"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/views/members"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
)

// testCloud is an in-process atoll-cloud with its embedded hub. It issues
// edge credentials through its identity service, as enrollment does, so
// the node's key is registered and published in its unit view.
type testCloud struct {
	*hub.Hub
	id *identity.Service

	mu    sync.Mutex
	creds map[string][2]string // node → its seed and user JWT, as its creds file keeps them
}

// IssueEdge issues and records node's credentials in unit for key pub.
func (c *testCloud) IssueEdge(node, unit, pub string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.id.IssueEdge(ctx, node, unit, pub)
}

// nodeCreds returns node's seed and user JWT in unit: issued at its first
// start, kept for its restarts (which may come while atoll-cloud is down).
func (c *testCloud) nodeCreds(t testing.TB, node, unit string) (seed, userJWT string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if kept, ok := c.creds[node]; ok {
		return kept[0], kept[1]
	}
	kp, _ := nkeys.CreateUser()
	raw, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	userJWT, err := c.IssueEdge(node, unit, pub)
	if err != nil {
		t.Fatal(err)
	}
	if c.creds == nil {
		c.creds = map[string][2]string{}
	}
	c.creds[node] = [2]string{string(raw), userJWT}
	return string(raw), userJWT
}

func cloud(t testing.TB, mutate ...func(*cloudapp.Config)) (*testCloud, *fxtest.App) {
	t.Helper()
	cfg := cloudapp.Default()
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.Hub.Host = "127.0.0.1"
	cfg.Hub.ClientPort, cfg.Hub.LeafPort = -1, -1
	cfg.Hub.StoreDir = t.TempDir()
	cfg.Members.Source = members.SourceDeclared
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &testCloud{}
	opts := fx.Options(cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn)), fx.Populate(&h.Hub, &h.id))
	if err := fx.ValidateApp(opts); err != nil {
		t.Fatalf("atoll-cloud graph: %v", err)
	}
	app := fxtest.New(t, opts)
	app.RequireStart()
	return h, app
}

type edge struct {
	node  *natsnode.Node
	mem   *membership.Membership
	admin *admin.Server
}

// readyz returns the agent's /readyz status code and body.
func (e edge) readyz(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + e.admin.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func startEdge(t testing.TB, h *testCloud, name, unit string, stateDir string, mutate ...func(*edgeapp.Config)) (edge, *fxtest.App) {
	t.Helper()
	seed, userJWT := h.nodeCreds(t, name, unit)
	cfg := edgeapp.Default()
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.NATS.NodeName = name
	cfg.NATS.Seed, cfg.NATS.UserJWT = seed, userJWT
	cfg.NATS.HubURLs = []string{h.LeafURL().String()}
	cfg.NATS.ClientPort, cfg.NATS.RoutePort = -1, -1
	cfg.NATS.RouteHost = "127.0.0.1"
	cfg.Reporter.Unit = unit
	cfg.Reporter.InternalIP = "127.0.0.1"
	cfg.Reporter.Period = 500 * time.Millisecond
	cfg.Membership.StateDir = stateDir
	for _, m := range mutate {
		m(&cfg)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var e edge
	opts := fx.Options(edgeapp.Options(cfg, natstest.Logger(t, slog.LevelWarn)), fx.Populate(&e.node, &e.mem, &e.admin))
	if err := fx.ValidateApp(opts); err != nil {
		t.Fatalf("atoll-edge graph: %v", err)
	}
	app := fxtest.New(t, opts)
	app.RequireStart()
	return e, app
}

func waitMeshed(t *testing.T, unit string, edges ...edge) {
	t.Helper()
	poll.Eventually(t, 15*time.Second, func() error {
		for _, e := range edges {
			var want []string
			for _, p := range edges {
				if p.node != e.node {
					want = append(want, p.node.Name())
				}
			}
			slices.Sort(want)
			st := e.node.Status()
			if st.Unit != unit || !slices.Equal(st.RoutedPeers, want) {
				return fmt.Errorf("%s: unit %q routes %v, want unit %q routes %v", e.node.Name(), st.Unit, st.RoutedPeers, unit, want)
			}
			if got := len(e.mem.Current().Members); got != len(edges) {
				return fmt.Errorf("%s knows %d members, want %d", e.node.Name(), got, len(edges))
			}
		}
		return nil
	})
}

// TestEdgesJoinTheirUnit: atoll-cloud and three atoll-edge apps start; the
// agents report themselves, the cloud publishes their assignment and unit
// view, and the agents' servers mesh over routes. A restarted agent rejoins
// its unit from its kept state even while the hub is unreachable.
func TestEdgesJoinTheirUnit(t *testing.T) {
	h, cloudApp := cloud(t)
	var edges []edge
	var apps []*fxtest.App
	dirs := map[string]string{}
	for _, name := range []string{"a", "b", "c"} {
		dirs[name] = t.TempDir()
		e, app := startEdge(t, h, name, "u1", dirs[name])
		edges, apps = append(edges, e), append(apps, app)
	}
	defer func() {
		for _, a := range apps[:2] {
			a.RequireStop()
		}
	}()
	waitMeshed(t, "u1", edges...)
	// Meshed agents hold their unit's view and their hub link: ready.
	poll.Eventually(t, 10*time.Second, func() error {
		if code, body := edges[0].readyz(t); code != http.StatusOK {
			return fmt.Errorf("readyz %d: %s", code, body)
		}
		return nil
	})

	// With its own node's credentials, each agent hears its assignment
	// and unit view republished and catches them up from the stream.
	poll.Eventually(t, 10*time.Second, func() error {
		for _, e := range edges {
			for _, feed := range []string{`feed="assignment"`, `feed="unit_view"`} {
				if n := e.metric(t, "atoll_viewfeed_catchups_total", feed); n < 1 {
					return fmt.Errorf("%s caught up its %s %v times", e.node.Name(), feed, n)
				}
			}
		}
		return nil
	})

	// c restarts while the cloud is gone: it rejoins u1 from its kept state.
	apps[2].RequireStop()
	cloudApp.RequireStop()
	c, app := startEdge(t, h, "c", "u1", dirs["c"])
	defer app.RequireStop()
	waitMeshed(t, "u1", edges[0], edges[1], c)
	if c.node.Status().HubConnected {
		t.Fatal("hub link up while the hub is stopped")
	}
	// Its kept view counts; the lost hub link does not, and is named.
	code, body := c.readyz(t)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-] hub-link") || !strings.Contains(body, "[+] membership ok") {
		t.Fatalf("readyz of an agent without its hub link: %d\n%s", code, body)
	}
}

// TestEdgeFxGraphs: the atoll-edge graph validates and stops cleanly even
// when no hub is reachable.
func TestEdgeStartsWithoutHub(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	cfg := edgeapp.Default()
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.NATS.NodeName = "lonely"
	cfg.NATS.Seed = string(seed)
	cfg.NATS.HubURLs = []string{"nats-leaf://127.0.0.1:1"}
	cfg.NATS.ClientPort, cfg.NATS.RoutePort = -1, -1
	cfg.NATS.RouteHost = "127.0.0.1"
	cfg.Membership.StateDir = t.TempDir()
	app := fxtest.New(t, edgeapp.Options(cfg, natstest.Logger(t, slog.LevelError)))
	app.RequireStart().RequireStop()
}

// TestRoundBudgetWithinFreshness: a probe round budget above half the vote
// timeout is refused, naming both.
func TestRoundBudgetWithinFreshness(t *testing.T) {
	c := edgeapp.Default()
	c.NATS.NodeName = "n1"
	c.NATS.HubURLs = []string{"nats-leaf://127.0.0.1:7422"}
	c.NATS.Seed = "unused"
	c.Voter.Timeout = 4 * time.Second // the default budget is 3 s
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "round budget") {
		t.Fatalf("Validate() = %v, want an error about the round budget", err)
	}
	c.Prober.RoundBudget = 2 * time.Second
	if err := c.Validate(); err != nil {
		t.Fatalf("budget at half the timeout: %v", err)
	}
}

// TestViewCheckWithinProbePeriod: a view check slower than the probe
// period is refused, naming both flags; zero is refused by the view feeds.
func TestViewCheckWithinProbePeriod(t *testing.T) {
	c := edgeapp.Default()
	c.NATS.NodeName = "n1"
	c.NATS.HubURLs = []string{"nats-leaf://127.0.0.1:7422"}
	c.NATS.Seed = "unused"
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	c.ViewFeed.CheckPeriod = 0
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "CheckPeriod") {
		t.Fatalf("Validate() = %v, want an error about the check period", err)
	}
}

// TestHubURLsFlag: --hub-url takes every hub server's URL, repeated or
// comma-separated, and a bad one is refused naming it.
func TestHubURLsFlag(t *testing.T) {
	c := edgeapp.Default()
	fs := flag.NewFlagSet("atoll-edge", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"--node-name=n1",
		"--hub-url=nats-leaf://hub-0:7422,nats-leaf://hub-1:7422", "--hub-url", "tls://hub-2:7422"})
	if err != nil {
		t.Fatal(err)
	}
	c.Finish()
	want := []string{"nats-leaf://hub-0:7422", "nats-leaf://hub-1:7422", "tls://hub-2:7422"}
	if !slices.Equal(c.NATS.HubURLs, want) {
		t.Fatalf("hub URLs %v, want %v", c.NATS.HubURLs, want)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("three hub URLs: %v", err)
	}
	c.NATS.HubURLs = append(c.NATS.HubURLs, "http://hub-3:7422")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "http://hub-3:7422") {
		t.Fatalf("Validate() = %v, want the bad URL named", err)
	}
}
