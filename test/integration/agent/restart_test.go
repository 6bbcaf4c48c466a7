package agent_test

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/fx/fxtest"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/test/freeport"
	"github.com/atoll-edge/atoll/test/gobuild"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// production turns on what deploy/ turns on: the endpoints proxy and the
// tunnel.
func production(c *edgeapp.Config) {
	c.Proxy.Enabled, c.Proxy.Addr = true, "127.0.0.1:0"
	c.Tunnel.Enabled = true
}

// restartReady stops app and starts node name's agent again on the same
// state, and returns it with how long it took, from the start, to answer
// /readyz with 200, and the leaf links it held until then (their ids).
func restartReady(t testing.TB, h *testCloud, app *fxtest.App, name, dir string) (edge, *fxtest.App, time.Duration, []uint64) {
	app.RequireStop()
	started := time.Now()
	e, app := startEdge(t, h, name, "u1", dir, production)
	var links []uint64
	for {
		if id := e.node.HubLink().ID; id != 0 && !slices.Contains(links, id) {
			links = append(links, id)
		}
		resp, err := http.Get("http://" + e.admin.Addr() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, app, time.Since(started), links
			}
		}
		if time.Since(started) > 30*time.Second {
			t.Fatalf("%s not ready 30 s after its restart", name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRestartKeepsItsUnit: an agent restarted with its state on disk
// starts its server in its unit's cluster, and its leaf link to the hub,
// once up, is never closed for a cluster name that changed under it (the
// first link is the one it keeps).
func TestRestartKeepsItsUnit(t *testing.T) {
	h, _ := cloud(t)
	dirs := map[string]string{}
	var edges []edge
	var apps []*fxtest.App
	for _, name := range []string{"a", "b"} {
		dirs[name] = t.TempDir()
		e, app := startEdge(t, h, name, "u1", dirs[name], production)
		edges, apps = append(edges, e), append(apps, app)
	}
	waitMeshed(t, "u1", edges...)
	poll.Eventually(t, 20*time.Second, func() error {
		for _, e := range edges {
			if code, body := e.readyz(t); code != http.StatusOK {
				return fmt.Errorf("%s: readyz %d: %s", e.node.Name(), code, body)
			}
		}
		return nil
	})
	b, app, took, links := restartReady(t, h, apps[1], "b", dirs["b"])
	defer app.RequireStop()
	defer apps[0].RequireStop()
	if st := b.node.Status(); st.Unit != "u1" {
		t.Fatalf("restarted b's server is in unit %q", st.Unit)
	}
	// Two seconds more: longer than the server's 1 s reconnect delay.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if id := b.node.HubLink().ID; id != 0 && !slices.Contains(links, id) {
			links = append(links, id)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(links) != 1 {
		t.Fatalf("the restarted agent held leaf links %v: its first was closed and dialed again", links)
	}
	t.Logf("ready %v after the restart, its first leaf link kept", took)
}

// BenchmarkRestartReady restarts an agent with its state on disk
// (production components on: proxy, tunnel; its unit's other agent and
// atoll-cloud with the embedded hub running, all in this process) 10
// times (ATOLL_RESTARTS) and prints the median and the worst time from
// the start to /readyz 200. Run it with `go tool task bench:restart`.
func BenchmarkRestartReady(b *testing.B) {
	restarts := benchRestarts(b)
	h, _ := cloud(b)
	dirs := map[string]string{}
	var apps []*fxtest.App
	for _, name := range []string{"a", "b"} {
		dirs[name] = b.TempDir()
		_, app := startEdge(b, h, name, "u1", dirs[name], production)
		apps = append(apps, app)
	}
	defer apps[0].RequireStop()
	app := apps[1]
	var took []time.Duration
	for i := 0; i <= restarts; i++ {
		var d time.Duration
		_, app, d, _ = restartReady(b, h, app, "b", dirs["b"])
		if i > 0 { // the first follows the first start, whose state was not complete yet
			took = append(took, d)
		}
	}
	app.RequireStop()
	reportRestarts(b, took)
}

// benchRestarts is the number of restarts a benchmark measures:
// $ATOLL_RESTARTS, 10 by default.
func benchRestarts(b *testing.B) int {
	v := os.Getenv("ATOLL_RESTARTS")
	if v == "" {
		return 10
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("ATOLL_RESTARTS=%q: want a positive count", v)
	}
	return n
}

// reportRestarts reports and prints the median and the worst of took.
func reportRestarts(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "median-ms")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "max-ms")
	fmt.Printf("%s: restart to ready, %d restarts: median %v, max %v, all %v\n", b.Name(), len(took), took[len(took)/2].Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond), took)
}

// agentProcess is node name's atoll-edge as deployed: the
// services/atoll-edge binary in a process of its own, with the flags
// deploy/ gives it (endpoints proxy and tunnel on), its credentials in a
// file and its state in dir.
type agentProcess struct {
	t     testing.TB
	name  string
	bin   string
	args  []string
	admin string
	log   string
	cmd   *exec.Cmd
}

func newAgentProcess(t testing.TB, h *testCloud, name, unit, dir string) *agentProcess {
	t.Helper()
	bin, err := gobuild.Binary(t.Context(), "services/atoll-edge")
	if err != nil {
		t.Fatal(err)
	}
	credsDir := filepath.Join(dir, "creds")
	if err := os.MkdirAll(credsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	creds, err := natstest.WriteCreds(credsDir, h.Issuer(), func(_ *identity.Issuer, pub string) (string, error) {
		return h.IssueEdge(name, unit, pub)
	})
	if err != nil {
		t.Fatal(err)
	}
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	p := &agentProcess{t: t, name: name, bin: bin, admin: fmt.Sprintf("127.0.0.1:%d", port), log: filepath.Join(dir, "atoll-edge.log")}
	p.args = []string{"--node-name=" + name, "--unit=" + unit, "--hub-url=" + h.LeafURL().String(), "--hub-domain=" + h.Domain(),
		"--creds-file=" + creds, "--client-port=-1", "--route-port=-1", "--route-host=127.0.0.1", "--internal-ip=127.0.0.1",
		"--state-dir=" + filepath.Join(dir, "state"), "--admin-addr=" + p.admin, "--proxy-addr=127.0.0.1:0", "--tunnel",
		"--report-period=500ms", "--log-format=text"}
	t.Cleanup(p.kill)
	return p
}

// start runs the agent (again) and returns when it answers /readyz with
// 200, with how long that took from the start.
func (p *agentProcess) start() time.Duration {
	p.t.Helper()
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		p.t.Fatal(err)
	}
	defer out.Close()
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	started := time.Now()
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get("http://" + p.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(started)
			}
		}
		if time.Since(started) > 30*time.Second {
			b, _ := os.ReadFile(p.log)
			p.t.Fatalf("%s not ready 30 s after its start; its log:\n%s", p.name, b)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kill sends SIGKILL: no shutdown, state files as they are, the leaf
// connection closed by the kernel.
func (p *agentProcess) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
	p.cmd = nil
}

// leafLinks returns the ids of node's leaf connections the hub holds.
func leafLinks(t testing.TB, h *testCloud, node string) []uint64 {
	t.Helper()
	lz, err := h.Server().Leafz(&server.LeafzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, l := range lz.Leafs {
		if l.Name == node {
			ids = append(ids, l.ID)
		}
	}
	return ids
}

// TestKilledAgentKeepsItsUnit: atoll-edge as deployed, killed with
// SIGKILL and started again on its state directory, is ready with one
// leaf link to the hub (never closed for a cluster name that changed
// under it) and back in its unit, meshed with its peer.
func TestKilledAgentKeepsItsUnit(t *testing.T) {
	h, _ := cloud(t)
	a, app := startEdge(t, h, "a", "u1", t.TempDir(), production)
	defer app.RequireStop()
	b := newAgentProcess(t, h, "b", "u1", t.TempDir())
	b.start()
	meshed := func() error {
		if st := a.node.Status(); !slices.Equal(st.RoutedPeers, []string{"b"}) {
			return fmt.Errorf("a routes %v, want [b]", st.RoutedPeers)
		}
		return nil
	}
	poll.Eventually(t, 20*time.Second, meshed)
	for i := range 3 {
		b.kill()
		took := b.start()
		var links []uint64
		deadline := time.Now().Add(2 * time.Second) // longer than the server's 1 s reconnect delay
		for time.Now().Before(deadline) {
			for _, id := range leafLinks(t, h, "b") {
				if !slices.Contains(links, id) {
					links = append(links, id)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if len(links) != 1 {
			t.Fatalf("restart %d: the hub saw b's leaf links %v after its start, want one", i+1, links)
		}
		poll.Eventually(t, 10*time.Second, meshed)
		t.Logf("restart %d: ready %v after SIGKILL and start, one leaf link", i+1, took)
	}
}

// BenchmarkKilledRestartReady is BenchmarkRestartReady as deployed: the
// agent is the atoll-edge binary in its own process, killed with SIGKILL
// and started again on its state directory 10 times (ATOLL_RESTARTS);
// the time runs from the process start (runtime, flags, state read) to
// /readyz 200. Run it with `go tool task bench:restart`.
func BenchmarkKilledRestartReady(b *testing.B) {
	restarts := benchRestarts(b)
	h, _ := cloud(b)
	_, app := startEdge(b, h, "a", "u1", b.TempDir(), production)
	defer app.RequireStop()
	p := newAgentProcess(b, h, "b", "u1", b.TempDir())
	p.start() // the first start, whose state was not complete yet
	time.Sleep(time.Second)
	var took []time.Duration
	for range restarts {
		p.kill()
		took = append(took, p.start())
	}
	p.kill()
	reportRestarts(b, took)
}
