package fabric_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// The leaf capacity measurement runs the hub in a child process (this
// test binary again, running TestLeafCapacityHub), so the hub's memory is
// its own process's, and connects in-process edge servers (real
// nats-servers, edge credentials, one leaf link each) to it in steps.
const (
	envHubDir  = "ATOLL_LEAF_HUB_DIR"  // set in the child: its store directory
	envHubPort = "ATOLL_LEAF_HUB_PORT" // the child's leaf port
	envHubCli  = "ATOLL_LEAF_HUB_CLIENT_PORT"
)

// TestLeafCapacityHub is the hub process of BenchmarkLeafCapacity; it is
// skipped unless run as that child. It prints "ready" once serving and
// runs until its standard input closes.
func TestLeafCapacityHub(t *testing.T) {
	dir := os.Getenv(envHubDir)
	if dir == "" {
		t.Skip("the hub process of BenchmarkLeafCapacity")
	}
	cfg := hub.Default()
	cfg.Host, cfg.StoreDir = "127.0.0.1", dir
	var err error
	if cfg.LeafPort, err = strconv.Atoi(os.Getenv(envHubPort)); err != nil {
		t.Fatal(err)
	}
	if cfg.ClientPort, err = strconv.Atoi(os.Getenv(envHubCli)); err != nil {
		t.Fatal(err)
	}
	h, err := hub.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Shutdown(context.Background()) }()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// rssKiB is the resident set of process pid, from /proc.
func rssKiB(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// BenchmarkLeafCapacity measures how many real leaf connections one hub
// server holds and its memory per leaf: a hub in its own process, and
// ATOLL_BENCH_LEAFS (default 1000) edge servers with edge credentials
// joining it in steps of ATOLL_BENCH_LEAF_STEP (default 250). For each
// step it reports the hub's resident memory, the memory per leaf above
// the empty hub, and how long the step took to connect. The edge servers
// run in the benchmark's process (each a nats-server: a few MiB each, so
// 1,000 of them want a few GiB). Run on a quiet machine:
//
//	ATOLL_BENCH_LEAFS=2000 go test -run '^$' -bench LeafCapacity -benchtime 1x -timeout 30m ./cloud/hub/
func BenchmarkLeafCapacity(b *testing.B) {
	total, step := envInt(b, "ATOLL_BENCH_LEAFS", 1000), envInt(b, "ATOLL_BENCH_LEAF_STEP", 250)
	// The edges' leaf link compression (default: atoll-edge's).
	compression := cmp.Or(os.Getenv("ATOLL_BENCH_LEAF_COMPRESSION"), natsnode.Default().HubCompression)
	dir := b.TempDir()
	port, err := natstest.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	cport, err := natstest.FreePort()
	if err != nil {
		b.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestLeafCapacityHub$", "-test.v")
	child.Env = append(os.Environ(), envHubDir+"="+dir, envHubPort+"="+strconv.Itoa(port), envHubCli+"="+strconv.Itoa(cport))
	stdin, err := child.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	child.Stderr = os.Stderr
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = child.Wait() })
	lines := bufio.NewScanner(stdout)
	for lines.Scan() && lines.Text() != "ready" {
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }()

	keys, err := identity.LoadKeys(filepath.Join(dir, "identity"))
	if err != nil {
		b.Fatal(err)
	}
	issuer := identity.NewIssuer(keys, hub.Default().Domain)
	// The hub's streams, as atoll-cloud makes them: the leafs' interest
	// (and so what each costs the hub) includes the stream subjects.
	skp, _ := nkeys.CreateUser()
	spub, _ := skp.PublicKey()
	sjwt, err := issuer.Service("bench", spub)
	if err != nil {
		b.Fatal(err)
	}
	sseed, _ := skp.Seed()
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", cport), nats.UserJWTAndSeed(sjwt, string(sseed)))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, hub.Default().Domain)
	if err != nil {
		b.Fatal(err)
	}
	if err := eventbus.EnsureStreams(b.Context(), js, events.DefaultStreamOptions()); err != nil {
		b.Fatal(err)
	}
	leafURL := fmt.Sprintf("nats-leaf://127.0.0.1:%d", port)
	base, err := rssKiB(child.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	var edges []*natsnode.Node
	b.Cleanup(func() {
		for _, n := range edges {
			_ = n.Shutdown(context.Background())
		}
	})
	type row struct {
		Leafs          int
		HubRSSMiB      float64
		PerLeafKiB     float64
		StepSeconds    float64
		LeafsPerSecond float64
	}
	var rows []row
	for len(edges) < total {
		start := time.Now()
		for range min(step, total-len(edges)) {
			name := fmt.Sprintf("leaf-%05d", len(edges))
			kp, err := nkeys.CreateUser()
			if err != nil {
				b.Fatal(err)
			}
			seed, _ := kp.Seed()
			pub, _ := kp.PublicKey()
			jwt, err := issuer.Edge(name, "", pub, 0)
			if err != nil {
				b.Fatal(err)
			}
			cfg := natsnode.Default()
			cfg.NodeName, cfg.ClientPort, cfg.RoutePort, cfg.RouteHost = name, -1, -1, "127.0.0.1"
			cfg.Seed, cfg.UserJWT, cfg.HubURLs = string(seed), jwt, []string{leafURL}
			cfg.HubCompression = compression
			n, err := natsnode.New(cfg, log)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err = n.Start(ctx)
			cancel()
			if err != nil {
				b.Fatalf("edge %d: %v", len(edges), err)
			}
			edges = append(edges, n)
		}
		poll.Eventually(b, 5*time.Minute, func() error {
			up := 0
			for _, n := range edges {
				if n.Status().HubConnected {
					up++
				}
			}
			if up < len(edges) {
				return fmt.Errorf("%d of %d leafs connected", up, len(edges))
			}
			return nil
		})
		took := time.Since(start)
		rss, err := rssKiB(child.Process.Pid)
		if err != nil {
			b.Fatal(err)
		}
		r := row{Leafs: len(edges), HubRSSMiB: float64(rss) / 1024, PerLeafKiB: float64(rss-base) / float64(len(edges)),
			StepSeconds: took.Seconds(), LeafsPerSecond: float64(step) / took.Seconds()}
		rows = append(rows, r)
		b.Logf("%d leafs (compression %s): hub RSS %.1f MiB (%.1f KiB per leaf above the empty hub's %.1f MiB); step connected in %v",
			r.Leafs, compression, r.HubRSSMiB, r.PerLeafKiB, float64(base)/1024, took.Round(time.Millisecond))
	}
	last := rows[len(rows)-1]
	b.ReportMetric(float64(last.Leafs), "leafs")
	b.ReportMetric(last.HubRSSMiB, "hub-RSS-MiB")
	b.ReportMetric(last.PerLeafKiB, "KiB/leaf")
	out, _ := json.Marshal(rows)
	b.Logf("rows: %s", out)
}

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
