package health

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestCatchup: readiness waits for the newest vote stored at start, over
// every vote subject, and not for other HEALTH subjects.
func TestCatchup(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("catchup-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := events.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	log := natstest.Logger(t, slog.LevelWarn)

	var empty catchup
	if err := empty.ready(); err == nil {
		t.Fatal("ready before the head was read")
	}
	empty.run(ctx, js, log)
	if err := empty.ready(); err != nil {
		t.Fatalf("empty stream: %v", err)
	}

	var last uint64
	for _, n := range []string{"a", "b", "c"} {
		subj, err := events.VoteSubject("u1", n, "v")
		if err != nil {
			t.Fatal(err)
		}
		ack, err := events.PublishDurable(ctx, js, subj, &atollv1.Vote{Unit: "u1", Node: n, Voter: "v", Time: timestamppb.Now()}, "")
		if err != nil {
			t.Fatal(err)
		}
		last = ack.Sequence
	}
	// A probe report after the votes is no vote to wait for.
	probe, err := events.ProbeSubject("u1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := events.PublishDurable(ctx, js, probe, &atollv1.ProbeReport{Checker: "a", Unit: "u1", ReportTime: timestamppb.Now()}, ""); err != nil {
		t.Fatal(err)
	}
	var c catchup
	c.run(ctx, js, log)
	if err := c.ready(); err == nil || !strings.Contains(err.Error(), "following votes") {
		t.Fatalf("ready = %v before any delivery, want it to name the vote follower", err)
	}
	c.seen(last - 1)
	if err := c.ready(); err == nil {
		t.Fatal("ready one vote short of the head")
	}
	c.seen(last)
	if err := c.ready(); err != nil { // not waiting for the probe report's sequence
		t.Fatalf("caught up: %v", err)
	}
}
