package agent_test

import (
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/edge/edgeapp"
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
	restarts := 10
	if v := os.Getenv("ATOLL_RESTARTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("ATOLL_RESTARTS=%q: want a positive count", v)
		}
		restarts = n
	}
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
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "median-ms")
	b.ReportMetric(float64(took[len(took)-1].Milliseconds()), "max-ms")
	fmt.Printf("restart to ready, %d restarts: median %v, max %v, all %v\n", len(took), took[len(took)/2].Round(time.Millisecond),
		took[len(took)-1].Round(time.Millisecond), took)
}
