package eventbus_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/test/natstest"
)

// TestViewsRepublished: VIEWS republishes every view it stores on
// atoll.viewpub.<rest>, with its sequence and the subject's previous one,
// and nothing it refused. A VIEWS stream without the republish gets it at
// the next reconcile.
func TestViewsRepublished(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	nc, js := natstest.CloudJetStream(t, natstest.Hub(t))
	o := events.DefaultStreamOptions()
	o.Storage = jetstream.MemoryStorage
	old := viewsConfig(t, o)
	if old.RePublish == nil || old.RePublish.Source != events.ViewSubjects || old.RePublish.Destination != events.ViewRepublishSubjects {
		t.Fatalf("VIEWS republishes %+v, want %s → %s", old.RePublish, events.ViewSubjects, events.ViewRepublishSubjects)
	}
	old.RePublish = nil
	if _, err := js.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}

	sub, err := nc.SubscribeSync(events.ViewRepublishSubjects)
	if err != nil {
		t.Fatal(err)
	}
	subj, err := events.UnitViewSubject("site-a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subj, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
		t.Fatalf("the old VIEWS republished %s", m.Subject)
	}

	reconcileChanges(t, ctx, js, o, "RePublish")

	want, err := events.Republished(subj)
	if err != nil {
		t.Fatal(err)
	}
	next := func(prev uint64) uint64 {
		t.Helper()
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no republished view: %v", err)
		}
		if m.Subject != want || m.Header.Get(jetstream.SubjectHeader) != subj {
			t.Fatalf("republished on %s (of %s), want %s (of %s)", m.Subject, m.Header.Get(jetstream.SubjectHeader), want, subj)
		}
		seq, err := strconv.ParseUint(m.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			t.Fatalf("sequence header %q: %v", m.Header.Get(jetstream.SequenceHeader), err)
		}
		if got := m.Header.Get("Nats-Last-Sequence"); got != strconv.FormatUint(prev, 10) {
			t.Fatalf("Nats-Last-Sequence %q, want %d (the subject's previous message)", got, prev)
		}
		return seq
	}
	ack, err := js.Publish(ctx, subj, []byte("after"))
	if err != nil {
		t.Fatal(err)
	}
	if seq := next(1); seq != ack.Sequence {
		t.Fatalf("republished sequence %d, want %d", seq, ack.Sequence)
	}
	// A publish the stream refuses is never republished.
	if _, err := js.Publish(ctx, subj, []byte("refused"), jetstream.WithExpectLastSequencePerSubject(1)); err == nil {
		t.Fatal("a publish expecting a stale sequence was stored")
	}
	ack2, err := js.PublishMsg(ctx, &nats.Msg{Subject: subj, Data: []byte("third")}, jetstream.WithExpectLastSequencePerSubject(ack.Sequence))
	if err != nil {
		t.Fatal(err)
	}
	if seq := next(ack.Sequence); seq != ack2.Sequence {
		t.Fatalf("republished sequence %d, want %d", seq, ack2.Sequence)
	}
}
