package natsnode_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// The fabric benchmarks. Each run sets up a hub and a unit of three edge
// servers once, sends warmup untimed events, then measures; run them with
// -count N and TestMain prints the spread (min / median / max) of each
// metric over the N runs:
//
//	go test -run '^$' -bench . -benchtime 3s -count 5 ./edge/natsnode/

// warmup events are sent before the timed loop: the first publishes into
// a new file store and over new routes are slower than the steady state
// the tables report.
const warmup = 500

// report is a realistic probe report: a checker's view of 10 peers.
func report(checker string) *atollv1.ProbeReport {
	r := &atollv1.ProbeReport{Checker: checker, Unit: "u1", ReportTime: timestamppb.Now()}
	for i := range 10 {
		r.Peers = append(r.Peers, &atollv1.PeerResult{
			Node: fmt.Sprintf("node-%02d", i), Normal: true, Score: 100, Scoreline: 100,
			Plugins: []*atollv1.PluginResult{
				{Plugin: "tcp", Ok: true, Weight: 0.5, Score: 50, Attempts: 1},
				{Plugin: "http", Ok: true, Weight: 0.5, Score: 50, Attempts: 1},
			},
		})
	}
	return r
}

// ballot is a realistic ballot, what an edge sends the hub: a voter's
// verdicts on 10 peers.
func ballot(voter string) *atollv1.Ballot {
	b := &atollv1.Ballot{Voter: voter, Unit: "u1", Members: 11, Time: timestamppb.Now(), Ttl: durationpb.New(75 * time.Second)}
	for i := range 10 {
		b.Votes = append(b.Votes, &atollv1.Vote{Node: fmt.Sprintf("node-%02d", i), Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 10, Since: timestamppb.Now()})
	}
	return b
}

// spread keeps each benchmark's metrics over the -count runs.
var spread = struct {
	sync.Mutex
	runs map[string]map[string][]float64 // benchmark → metric → one value per run
}{runs: map[string]map[string][]float64{}}

// record records metric for this run of b and reports it to go test.
func record(b *testing.B, metric string, v float64) {
	b.ReportMetric(v, metric)
	if b.Name() == "" {
		return // testing.Benchmark from a test: no -count runs to summarize
	}
	spread.Lock()
	defer spread.Unlock()
	if spread.runs[b.Name()] == nil {
		spread.runs[b.Name()] = map[string][]float64{}
	}
	spread.runs[b.Name()][metric] = append(spread.runs[b.Name()][metric], v)
}

// throughput records events per second over n events in d.
func throughput(b *testing.B, n int, d time.Duration) { record(b, "events/s", float64(n)/d.Seconds()) }

// percentiles records the p50 and p99 of lat in µs.
func percentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(p float64) float64 {
		return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3
	}
	record(b, "p50-µs", at(0.50))
	record(b, "p99-µs", at(0.99))
}

// printSpread writes min / median / max of every recorded metric.
func printSpread(w io.Writer) {
	spread.Lock()
	defer spread.Unlock()
	if len(spread.runs) == 0 {
		return
	}
	names := make([]string, 0, len(spread.runs))
	for n := range spread.runs {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\nspread over the runs (-count)\nbenchmark\tmetric\truns\tmin\tmedian\tmax")
	for _, n := range names {
		metrics := make([]string, 0, len(spread.runs[n]))
		for m := range spread.runs[n] {
			metrics = append(metrics, m)
		}
		sort.Strings(metrics)
		for _, m := range metrics {
			v := slices.Clone(spread.runs[n][m])
			slices.Sort(v)
			med := v[len(v)/2]
			if len(v)%2 == 0 {
				med = (v[len(v)/2-1] + v[len(v)/2]) / 2
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%.4g\t%.4g\t%.4g\n", n, m, len(v), v[0], med, v[len(v)-1])
		}
	}
	_ = tw.Flush()
}

func TestMain(m *testing.M) {
	code := m.Run()
	printSpread(os.Stdout)
	os.Exit(code)
}

// stopClean tears a fabric down the way a clean stop goes: the clients
// first, then the servers one at a time, hub first, each only once every
// link is quiet. A server that closes a link while its peer is still
// writing to it makes the peer log an error (a reset or broken pipe). The
// edges follow the hub within their leaf reconnect interval (1 s), so
// none logs a failed reconnect.
func stopClean(t testing.TB, h *natstest.HubServer, unit []*natsnode.Node, clients ...*nats.Conn) {
	t.Helper()
	for _, nc := range clients {
		nc.Close()
	}
	servers := map[string]*server.Server{h.Name(): h.Server()}
	order := []string{h.Name()}
	for _, n := range unit {
		servers[n.Name()] = n.Server()
		order = append(order, n.Name())
	}
	poll.Eventually(t, 10*time.Second, func() error {
		for name, srv := range servers {
			if c := srv.NumClients(); c > 0 {
				return fmt.Errorf("%s: %d clients", name, c)
			}
		}
		return nil
	})
	for _, name := range order {
		poll.Eventually(t, 10*time.Second, func() error { return quiet(servers) })
		srv := servers[name]
		srv.Shutdown()
		srv.WaitForShutdown()
		delete(servers, name)
	}
}

// quiet reports why the links among servers are not quiet: every byte
// one end of a leaf link or route sent has arrived at the other end.
func quiet(servers map[string]*server.Server) error {
	type flow struct{ out, in int64 }
	links := map[[2]string]*flow{} // [from, to] → bytes sent by from, received by to
	add := func(from, to string, out, in int64) {
		k := [2]string{from, to}
		if links[k] == nil {
			links[k] = &flow{}
		}
		links[k].out += out
		links[k].in += in
	}
	for name, srv := range servers {
		lz, err := srv.Leafz(nil)
		if err != nil {
			return err
		}
		for _, l := range lz.Leafs {
			add(name, l.Name, l.OutBytes, 0)
			add(l.Name, name, 0, l.InBytes)
		}
		rz, err := srv.Routez(nil)
		if err != nil {
			return err
		}
		for _, r := range rz.Routes {
			add(name, r.RemoteName, r.OutBytes, 0)
			add(r.RemoteName, name, 0, r.InBytes)
		}
	}
	for k, f := range links {
		if f.out != f.in {
			return fmt.Errorf("%s → %s: %d bytes sent, %d received", k[0], k[1], f.out, f.in)
		}
	}
	return nil
}

// BenchmarkEdgeToHubJetStream measures an edge node publishing probe
// reports into the hub's HEALTH stream (file storage) through its leaf
// link: "sync" waits for each stream ack (latency, and the events/s that
// gives), "async" keeps up to 256 in flight (throughput, until the last
// ack).
func BenchmarkEdgeToHubJetStream(b *testing.B) {
	b.Run("sync", func(b *testing.B) {
		f := newJSFabric(b)
		defer f.stop(b)
		lat := make([]time.Duration, 0, 1<<16)
		var start time.Time
		n := 0
		for i := 0; b.Loop(); i++ {
			if i == 0 {
				start = time.Now()
			}
			t0 := time.Now()
			if _, err := events.PublishDurable(context.Background(), f.js, f.subj, f.r, fmt.Sprintf("s-%d", i)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
			n++
		}
		throughput(b, n, time.Since(start))
		percentiles(b, lat)
	})
	b.Run("async", func(b *testing.B) {
		f := newJSFabric(b)
		defer f.stop(b)
		ajs, _ := jetstream.NewWithDomain(f.nc, f.h.Domain(), jetstream.WithPublishAsyncMaxPending(256))
		var start time.Time
		n := 0
		for i := 0; b.Loop(); i++ {
			if i == 0 {
				start = time.Now()
			}
			if _, err := events.PublishAsync(ajs, f.subj, f.r, fmt.Sprintf("a-%d", i)); err != nil {
				b.Fatal(err)
			}
			n++
		}
		select {
		case <-ajs.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			b.Fatal("async publishes not acked")
		}
		throughput(b, n, time.Since(start))
	})
}

type jsFabric struct {
	h       *natstest.HubServer
	unit    []*natsnode.Node
	hnc, nc *nats.Conn
	js      jetstream.JetStream
	subj    string
	r       *atollv1.Ballot
}

// newJSFabric starts a hub with the Atoll streams and a unit of three,
// connects to node a and sends the warmup publishes.
func newJSFabric(b *testing.B) *jsFabric {
	f := &jsFabric{h: natstest.Hub(b)}
	var err error
	if f.hnc, err = f.h.Connect("bench"); err != nil {
		b.Fatal(err)
	}
	hjs, _ := jetstream.New(f.hnc)
	if err := eventbus.EnsureStreams(context.Background(), hjs, events.DefaultStreamOptions()); err != nil {
		b.Fatal(err)
	}
	f.unit = natstest.Unit(b, f.h, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	if f.nc, err = f.unit[0].Connect("bench"); err != nil {
		b.Fatal(err)
	}
	f.js, _ = jetstream.NewWithDomain(f.nc, f.h.Domain())
	f.subj, _ = events.BallotSubject("u1", "a")
	poll.Eventually(b, 10*time.Second, func() error {
		_, err := f.js.Publish(context.Background(), f.subj, nil)
		return err
	})
	f.r = ballot("a")
	data, _ := proto.Marshal(f.r)
	b.SetBytes(int64(len(data)))
	for i := range warmup {
		if _, err := events.PublishDurable(context.Background(), f.js, f.subj, f.r, fmt.Sprintf("w-%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	return f
}

func (f *jsFabric) stop(b *testing.B) { stopClean(b, f.h, f.unit, f.nc, f.hnc) }

// BenchmarkUnitFanout measures unit-local delivery: node a publishes probe
// reports over core NATS and both unit peers receive each one over routes.
// Latency is publish → the second peer received it: "latency" sends one
// report at a time, "throughput" keeps up to 512 in flight (its latency
// is mostly queueing).
func BenchmarkUnitFanout(b *testing.B) {
	b.Run("latency", func(b *testing.B) { benchFanout(b, 1, nil) })
	b.Run("throughput", func(b *testing.B) { benchFanout(b, 512, nil) })
}

// benchFanout runs the fan-out benchmark with at most window reports in
// flight; log, when set, receives the edge servers' logs.
func benchFanout(b *testing.B, window int, log *natstest.Buffer) {
	h := natstest.Hub(b)
	opts := natstest.EdgeOptions{}
	if log != nil {
		opts.Logger = bufLogger(log)
	}
	unit := natstest.Unit(b, h, "u1", opts, "a", "b", "c")
	subj, _ := events.ProbeSubject("u1", "a")
	var (
		mu      sync.Mutex
		got     = map[uint64]int{}
		lat     []time.Duration
		done    atomic.Int64
		clients []*nats.Conn
	)
	waitLinks(b, true, unit)
	for i, peer := range unit[1:] {
		bit := 1 << i
		nc, err := peer.Connect("bench")
		if err != nil {
			b.Fatal(err)
		}
		clients = append(clients, nc)
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			var r atollv1.ProbeReport
			if err := proto.Unmarshal(m.Data, &r); err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			got[r.GetSequence()] |= bit
			if got[r.GetSequence()] == 3 {
				lat = append(lat, time.Since(r.GetReportTime().AsTime()))
				delete(got, r.GetSequence())
				done.Add(1)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		_ = nc.Flush()
	}
	pub, err := unit[0].Connect("bench")
	if err != nil {
		b.Fatal(err)
	}
	clients = append([]*nats.Conn{pub}, clients...)
	defer func() {
		if log != nil {
			_, _ = log.Write([]byte(teardownMark + "\n"))
		}
		stopClean(b, h, unit, clients...)
	}()
	r := report("a")
	poll.Eventually(b, 10*time.Second, func() error {
		r.Sequence, r.ReportTime = 1<<62, timestamppb.Now()
		_ = events.Publish(pub, subj, r, "")
		if done.Load() == 0 {
			return fmt.Errorf("peers not reached yet")
		}
		return nil
	})

	// At most window reports in flight, so that the measurement is of
	// delivery, not of slow-consumer drops.
	wait := func(n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for done.Load() < n {
			if time.Now().After(deadline) {
				mu.Lock()
				pending := len(got)
				mu.Unlock()
				b.Fatalf("only %d of %d reports reached both peers (%d reached one)", done.Load(), n, pending)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	send := func(base int64, i int) {
		if i >= window {
			wait(base + int64(i-window+1))
		}
		r.Sequence, r.ReportTime = uint64(base)+uint64(i), timestamppb.Now()
		if err := events.Publish(pub, subj, r, ""); err != nil {
			b.Fatal(err)
		}
	}
	// The warmup reports count in done; the timed ones start after them.
	base := done.Load()
	for i := range warmup {
		send(base, i)
	}
	wait(base + warmup)
	mu.Lock()
	lat, got = lat[:0], map[uint64]int{}
	mu.Unlock()
	base = done.Load()

	var start time.Time
	n := 0
	for i := 0; b.Loop(); i++ {
		if i == 0 {
			start = time.Now()
		}
		send(base, i)
		n++
	}
	wait(base + int64(n))
	throughput(b, n, time.Since(start))
	mu.Lock()
	percentiles(b, lat)
	mu.Unlock()
}

// teardownMark separates a run's log from its teardown's.
const teardownMark = "--- teardown ---"

// bufLogger logs text lines into buf at debug level and above.
func bufLogger(buf *natstest.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestFanoutStopsWithoutErrors: a fan-out run and its teardown log no
// ERROR line on any edge server (no route reset on the way out).
func TestFanoutStopsWithoutErrors(t *testing.T) {
	var log natstest.Buffer
	res := testing.Benchmark(func(b *testing.B) { benchFanout(b, 512, &log) })
	if res.N == 0 {
		t.Fatalf("the benchmark did not run:\n%s", log.String())
	}
	_, teardown, ok := strings.Cut(log.String(), teardownMark)
	if !ok {
		t.Fatalf("no teardown:\n%s", log.String())
	}
	for _, l := range strings.Split(teardown, "\n") {
		if strings.Contains(l, "level=ERROR") {
			t.Errorf("error logged: %s", l)
		}
	}
}
