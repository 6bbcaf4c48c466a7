package voter

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	"github.com/atoll-edge/atoll/internal/testenv/poll"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// restartableHub is one hub server on fixed ports and a file store, that
// a test stops and starts again like a restarted process: the edges'
// leaf links reconnect to the same URL and the streams come back from disk.
type restartableHub struct {
	t   *testing.T
	cfg hub.Config

	mu    sync.Mutex
	h     *hub.Hub
	edges map[string]string
}

func newRestartableHub(t *testing.T) *restartableHub {
	t.Helper()
	cfg := hub.Default()
	cfg.Host = "127.0.0.1"
	var err error
	if cfg.ClientPort, err = natstest.FreePort(); err != nil {
		t.Fatal(err)
	}
	if cfg.LeafPort, err = natstest.FreePort(); err != nil {
		t.Fatal(err)
	}
	cfg.StoreDir = t.TempDir()
	r := &restartableHub{t: t, cfg: cfg, edges: map[string]string{}}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *restartableHub) start() {
	r.t.Helper()
	h, err := hub.New(r.cfg, natstest.Logger(r.t, slog.LevelError))
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.Start(ctx); err != nil {
		r.t.Fatalf("start hub: %v", err)
	}
	r.h = h
}

func (r *restartableHub) stop() {
	r.mu.Lock()
	h := r.h
	r.h = nil
	r.mu.Unlock()
	if h != nil {
		_ = h.Shutdown(context.Background())
	}
}

// IssueEdge issues node's credentials; they stay valid across restarts
// (the identity keys live in the store directory).
func (r *restartableHub) IssueEdge(node, unit, pub string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h.IssueEdge(node, unit, pub)
}

func (r *restartableHub) LeafURLs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.h.LeafURLs()
}

func (r *restartableHub) connect(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	r.mu.Lock()
	h := r.h
	r.mu.Unlock()
	nc, err := h.Connect("observer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

type storedVote struct {
	vote   *atollv1.Vote
	stored time.Time // the hub's clock
}

// storedVotes reads every vote in the stream, by judged node, in stream
// order.
func storedVotes(t *testing.T, js jetstream.JetStream) map[string][]storedVote {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, events.StreamHealth, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.VoteSubjects}})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]storedVote{}
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var v atollv1.Vote
			if err := events.DecodeMsg(&nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()}, &v); err != nil {
				t.Fatal(err)
			}
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out[v.GetNode()] = append(out[v.GetNode()], storedVote{vote: &v, stored: md.Timestamp})
		}
		if n > 0 {
			continue
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.NumPending == 0 {
			break
		}
	}
	return out
}

// TestVotesSurviveHubRestart: the hub restarts while a voter runs in a
// healthy unit. What must hold, and what the test checks on the stream
// (kept whole here: no per-subject limit):
//
//   - a vote made while the hub was down reaches the stream by retry once
//     it is back (the outage is shorter than the refresh period), and any
//     vote that does not is superseded: for every node a vote is stored
//     within one refresh period of the hub's return;
//   - no verdict flips in the cloud: every stored vote says healthy, and
//     consecutive stored votes about a node are never further apart than
//     their TTL, so the cloud tracker (which expires a vote TTL after the
//     hub stored it) never lost the node's vote during the restart.
func TestVotesSurviveHubRestart(t *testing.T) {
	rh := newRestartableHub(t)
	servers := natstest.Unit(t, rh, "u1", natstest.EdgeOptions{}, "a", "b")
	_, js := rh.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: events.StreamHealth, Subjects: events.StreamSubjects(events.StreamHealth),
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Timeout, cfg.Skew, cfg.Tick, cfg.Refresh = 3*time.Second, 100*time.Millisecond, 50*time.Millisecond, 4*time.Second
	cfg.Retries, cfg.AckTimeout = 3, 500*time.Millisecond
	ncA, err := servers[0].Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ncA.Close)
	ncB, err := servers[1].Connect("checker")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ncB.Close)
	v, err := New(cfg, "a", newMembers("u1", "a", "b", "c"), hublink.Of(ncA, nil), natstest.Logger(t, slog.LevelError), nil, events.NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopVoter := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = v.Run(runCtx) })
	// Every member reports every member normal, over b's server (the unit's
	// routes work with the hub down).
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		all := map[string]bool{"a": true, "b": true, "c": true}
		for {
			for _, c := range []string{"a", "b", "c"} {
				publishReport(t, ncB, report(c, time.Now(), all))
			}
			select {
			case <-tick.C:
			case <-runCtx.Done():
				return
			}
		}
	})
	t.Cleanup(func() { stopVoter(); wg.Wait() })

	// Healthy votes on every node stored.
	poll.Eventually(t, 20*time.Second, func() error {
		for _, n := range []string{"a", "b", "c"} {
			if got, _ := v.Verdict(n); got != atollv1.Verdict_VERDICT_HEALTHY {
				return fmt.Errorf("verdict on %s: %v", n, got)
			}
		}
		if n := count(v.metrics.published.WithLabelValues(atollv1.Verdict_VERDICT_HEALTHY.String())); n < 3 {
			return fmt.Errorf("%v healthy votes stored", n)
		}
		return nil
	})

	retried := func() float64 { return count(v.metrics.sendFailures.WithLabelValues(reasonRetried)) }
	before := retried()
	rh.stop()
	down := time.Now()
	// Wait until a vote made during the outage has failed, then restart.
	poll.Eventually(t, 2*cfg.Refresh, func() error {
		if retried() <= before {
			return fmt.Errorf("no vote failed yet")
		}
		return nil
	})
	// Bounded while the hub is away: at most one vote per node waits.
	if w, f := v.outbox().pending(); w > 3 || f > cfg.MaxInFlight {
		t.Errorf("with the hub down: %d votes waiting, %d in flight", w, f)
	}
	rh.start()
	up := time.Now()
	t.Logf("hub down for %v", up.Sub(down).Round(time.Millisecond))
	_, js = rh.connect(t)

	// Everything made during the outage has had its chance by now.
	poll.Eventually(t, 3*cfg.Refresh, func() error {
		votes := storedVotes(t, js)
		for _, n := range []string{"b", "c"} { // the voter "a" casts no vote about itself
			last := votes[n][len(votes[n])-1]
			if !last.stored.After(up.Add(cfg.Refresh)) {
				return fmt.Errorf("latest vote on %s stored at %v", n, last.stored)
			}
		}
		return nil
	})
	stopVoter()
	wg.Wait()

	votes := storedVotes(t, js)
	ttl := 3 * cfg.Refresh // the TTL the voter gives
	byRetry := 0
	for _, n := range []string{"b", "c"} {
		var prev time.Time
		afterUp := false
		for _, sv := range votes[n] {
			if sv.vote.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY {
				t.Errorf("vote on %s made at %v says %v", n, sv.vote.GetTime().AsTime(), sv.vote.GetVerdict())
			}
			if !prev.IsZero() && sv.stored.Sub(prev) > ttl {
				t.Errorf("votes on %s stored %v apart (at %v and %v): the cloud's vote expired", n, sv.stored.Sub(prev), prev, sv.stored)
			}
			made := sv.vote.GetTime().AsTime()
			if made.After(down) && made.Before(up) {
				byRetry++ // made while the hub was down, stored after it returned
			}
			if sv.stored.After(up) && !sv.stored.After(up.Add(cfg.Refresh+cfg.AckTimeout)) {
				afterUp = true
			}
			prev = sv.stored
		}
		if !afterUp {
			t.Errorf("no vote on %s stored within a refresh period of the hub's return", n)
		}
	}
	if byRetry == 0 {
		t.Errorf("no vote made during the outage reached the stream after a retry")
	}
	for _, n := range []string{"a", "b", "c"} {
		for _, sv := range votes[n] {
			t.Logf("%s made %s stored %s", n, sv.vote.GetTime().AsTime().Format("15:04:05.000"), sv.stored.Format("15:04:05.000"))
		}
	}
	t.Logf("down %s up %s", down.Format("15:04:05.000"), up.Format("15:04:05.000"))
	t.Logf("votes made during the outage stored by retry: %d; failures: retried %v, superseded %v, dropped %v", byRetry,
		retried(), count(v.metrics.sendFailures.WithLabelValues(reasonSuperseded)), count(v.metrics.sendFailures.WithLabelValues(reasonDropped)))
}

// TestOutboxBoundedWhileNoStreamAnswers: a unit of 100 votes into a hub
// without the stream (as with the link down, nothing acknowledges) for
// several refresh periods: at most one vote per node waits, at most
// MaxInFlight are in flight, and votes are dropped, not piled up.
func TestOutboxBoundedWhileNoStreamAnswers(t *testing.T) {
	h := natstest.Hub(t)
	servers := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a")
	nc, err := servers[0].Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	names := []string{"a"}
	for i := range 99 {
		names = append(names, fmt.Sprintf("m%d", i))
	}
	cfg := DefaultConfig()
	cfg.Tick, cfg.Refresh, cfg.MaxInFlight, cfg.AckTimeout = 20*time.Millisecond, 300*time.Millisecond, 8, 100*time.Millisecond
	v, err := New(cfg, "a", newMembers("u1", names...), hublink.Of(nc, nil), natstest.Logger(t, slog.LevelError), nil, events.NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	poll.Eventually(t, 5*time.Second, func() error {
		if v.outbox() == nil {
			return fmt.Errorf("voter not running")
		}
		return nil
	})
	deadline := time.Now().Add(5 * cfg.Refresh)
	for time.Now().Before(deadline) {
		if w, f := v.outbox().pending(); w > len(names) || f > cfg.MaxInFlight {
			t.Fatalf("%d votes waiting (unit of %d), %d in flight (max %d)", w, len(names), f, cfg.MaxInFlight)
		}
		time.Sleep(10 * time.Millisecond) // sampling, not waiting for a state
	}
	dropped := count(v.metrics.sendFailures.WithLabelValues(reasonDropped)) + count(v.metrics.sendFailures.WithLabelValues(reasonSuperseded))
	if dropped < float64(len(names)) {
		t.Fatalf("only %v votes given up or superseded after %d refresh periods with nothing acknowledging", dropped, 5)
	}
	if n := count(v.metrics.published.WithLabelValues(atollv1.Verdict_VERDICT_NONE.String())); n != 0 {
		t.Fatalf("%v votes counted as stored with no stream", n)
	}
}
