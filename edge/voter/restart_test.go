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

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

type storedBallot struct {
	ballot *atollv1.Ballot
	stored time.Time // the hub's clock
}

// storedBallots reads every ballot in the stream, in stream order.
func storedBallots(t *testing.T, js jetstream.JetStream) []storedBallot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, events.StreamHealth, jetstream.OrderedConsumerConfig{FilterSubjects: []string{events.BallotSubjects}})
	if err != nil {
		t.Fatal(err)
	}
	var out []storedBallot
	for {
		batch, err := c.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var b atollv1.Ballot
			if err := events.DecodeMsg(&nats.Msg{Subject: m.Subject(), Data: m.Data(), Header: m.Headers()}, &b); err != nil {
				t.Fatal(err)
			}
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, storedBallot{ballot: &b, stored: md.Timestamp})
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

// TestBallotsSurviveHubRestart: the hub restarts while a voter runs in a
// healthy unit. What must hold, and what the test checks on the stream
// (kept whole here: no per-subject limit):
//
//   - the ballot that failed while the hub was down is retried until the
//     hub, back, acknowledges it, and is in the stream exactly once: stored
//     by the retry, or, when the hub had stored it just before it went down
//     and only the acknowledgement was lost, already (the retry is a
//     duplicate); unless a newer ballot replaced it;
//   - no verdict flips in the cloud: every stored ballot says healthy about
//     b and c, and consecutive stored ballots are never further apart than
//     their TTL, so the cloud tracker (which expires a ballot TTL after the
//     hub stored it) never lost the voter during the restart.
func TestBallotsSurviveHubRestart(t *testing.T) {
	rh := natstest.NewRestartableHub(t)
	servers := natstest.Unit(t, rh, "u1", natstest.EdgeOptions{}, "a", "b")
	_, js := rh.Connect(t, "observer")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: events.StreamHealth, Subjects: events.StreamSubjects(events.StreamHealth),
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
	}); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.Timeout, cfg.Skew, cfg.Tick, cfg.KeepAlive, cfg.TTL = 3*time.Second, 100*time.Millisecond, 50*time.Millisecond, 5*time.Second, 15*time.Second
	cfg.AckTimeout, cfg.RetryMin, cfg.RetryMax = 500*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond
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
	v, err := New(cfg, "a", newMembers("u1", "a", "b", "c"), hublink.Of(ncA, nil), natstest.Logger(t, slog.LevelError), nil, eventbus.NewMetrics(nil))
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

	healthy := func(b *atollv1.Ballot) bool {
		votes := b.GetVotes()
		for _, vote := range votes {
			if vote.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY {
				return false
			}
		}
		return len(votes) == 2
	}
	// A healthy ballot stored.
	poll.Eventually(t, 20*time.Second, func() error {
		for _, sb := range storedBallots(t, js) {
			if healthy(sb.ballot) {
				return nil
			}
		}
		return fmt.Errorf("no healthy ballot stored")
	})

	retried := func() float64 { return count(v.metrics.sendFailures.WithLabelValues(reasonRetried)) }
	before := retried()
	rh.Stop()
	down := time.Now()
	// Wait until a ballot made during the outage has failed, then restart.
	poll.Eventually(t, 3*cfg.KeepAlive, func() error {
		if retried() <= before {
			return fmt.Errorf("no ballot failed yet")
		}
		return nil
	})
	// The ballot that failed: it waits to be stored (nothing acknowledges
	// anything while the hub is down) unless a newer one replaces it.
	superseded := func() float64 { return count(v.metrics.sendFailures.WithLabelValues(reasonSuperseded)) }
	waiting, pendingMade := v.sender().waitingSince()
	if !waiting {
		t.Fatal("a ballot failed, but none waits to be stored")
	}
	supersededBefore := superseded()
	restarting := time.Now() // the hub may store a retry before start returns
	rh.Start()
	up := time.Now()
	t.Logf("hub down for %v", up.Sub(down).Round(time.Millisecond))
	_, js = rh.Connect(t, "observer")

	poll.Eventually(t, 2*cfg.KeepAlive, func() error {
		all := storedBallots(t, js)
		if len(all) == 0 || !all[len(all)-1].stored.After(up) {
			return fmt.Errorf("no ballot stored since the hub returned")
		}
		return nil
	})
	// The hub acknowledged the failed ballot (or a newer one) after it
	// returned: the voter stopped retrying it.
	poll.Eventually(t, 2*cfg.KeepAlive, func() error {
		if _, acked := v.sender().pending(); acked.Before(pendingMade) {
			return fmt.Errorf("the ballot made at %v is still not acknowledged (last acknowledged made %v)", pendingMade, acked)
		}
		return nil
	})
	stopVoter()
	wg.Wait()

	var prev time.Time
	byRetry, pending := 0, 0
	var pendingStored time.Time
	all := storedBallots(t, js)
	// Ballots made before the first reports arrived say none: the test
	// watches from the first healthy one on.
	for len(all) > 0 && !healthy(all[0].ballot) {
		all = all[1:]
	}
	for _, sb := range all {
		if !healthy(sb.ballot) {
			t.Errorf("ballot made at %v is not healthy on b and c: %v", sb.ballot.GetTime().AsTime(), sb.ballot.GetVotes())
		}
		if !prev.IsZero() && sb.stored.Sub(prev) > cfg.TTL {
			t.Errorf("ballots stored %v apart (at %v and %v): the cloud's count expired", sb.stored.Sub(prev), prev, sb.stored)
		}
		made := sb.ballot.GetTime().AsTime()
		if made.Before(restarting) && sb.stored.After(restarting) {
			byRetry++ // made before the hub returned, stored after: by retry
		}
		if made.Equal(pendingMade) {
			pending++
			pendingStored = sb.stored
		}
		prev = sb.stored
	}
	// The ballot that failed while the hub was down is in the stream, once,
	// unless a newer one replaced it first (then that newer one was
	// stored, as checked above). Usually the retry stored it after the
	// hub returned. But the hub may have stored it just before it went
	// down, with only the acknowledgement lost (the publish was in flight
	// at the shutdown, or its ack took longer than AckTimeout on a loaded
	// machine): the retry, same Nats-Msg-Id, is then acknowledged as a
	// duplicate (the stream rebuilds its duplicate window from disk at
	// start) and nothing is stored after the return. Both are right; a
	// ballot in neither case is lost, one stored twice was not deduplicated.
	replaced := superseded() - supersededBefore
	switch {
	case pending > 1:
		t.Errorf("the ballot that failed while the hub was down (made %v) is stored %d times", pendingMade, pending)
	case pending == 0 && replaced == 0:
		t.Errorf("the ballot that failed while the hub was down (made %v) never reached the stream, and none replaced it", pendingMade)
	}
	how := "replaced by a newer ballot"
	switch {
	case pending == 1 && pendingStored.After(restarting):
		how = "stored by retry after the hub returned"
	case pending == 1:
		how = fmt.Sprintf("stored %v before the hub went down, its ack lost (the retry was a duplicate)", down.Sub(pendingStored).Round(time.Millisecond))
	}
	t.Logf("%d ballots stored, %d made before the hub returned and stored by retry; the failed ballot %s; failures: retried %v, superseded %v", len(all), byRetry,
		how, retried(), superseded())
}

// TestBallotRetriedUntilStored: with no stream to acknowledge it (as with
// the link down) a ballot is retried, one at a time and never piled up,
// past many ack timeouts; once the stream exists it is stored, once.
func TestBallotRetriedUntilStored(t *testing.T) {
	h := natstest.Hub(t)
	servers := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a")
	nc, err := servers[0].Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg := DefaultConfig()
	cfg.Tick, cfg.AckTimeout, cfg.RetryMin, cfg.RetryMax = 20*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond, 100*time.Millisecond
	v, err := New(cfg, "a", newMembers("u1", "a", "b", "c"), hublink.Of(nc, nil), natstest.Logger(t, slog.LevelError), nil, eventbus.NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = v.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	poll.Eventually(t, 10*time.Second, func() error {
		if n := count(v.metrics.sendFailures.WithLabelValues(reasonRetried)); n < 10 {
			return fmt.Errorf("%v retries so far", n)
		}
		if _, _, w := v.Tracked(); w != 1 {
			return fmt.Errorf("%d ballots waiting, want 1", w)
		}
		return nil
	})
	if n := count(v.metrics.published.WithLabelValues("change")); n != 0 {
		t.Fatalf("%v ballots counted as stored with no stream", n)
	}
	obs, err := h.Connect("observer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(obs.Close)
	js, err := jetstream.New(obs)
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.StreamOptions{Replicas: 1, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if _, _, w := v.Tracked(); w != 0 {
			return fmt.Errorf("ballot still waiting")
		}
		return nil
	})
	got := storedBallots(t, js)
	if len(got) != 1 || got[0].ballot.GetKeepalive() {
		t.Fatalf("stored %d ballots (%v), want the one change ballot", len(got), got)
	}
}
