package eventbus_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/natstest"
)

func hubJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := natstest.CloudJetStream(t, natstest.Hub(t))
	return js
}

// TestReconcileStreamsUpdatesLimits: streams are created once, left alone
// while their definition holds, and updated when a limit changes.
func TestReconcileStreamsUpdatesLimits(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	js := hubJetStream(t)
	o := events.DefaultStreamOptions()
	changes, err := eventbus.ReconcileStreams(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(changes) != len(events.Streams(o)) || !changes[0].Created {
		t.Fatalf("first start: %+v, want every stream created", changes)
	}
	if changes, err = eventbus.ReconcileStreams(ctx, js, o); err != nil || len(changes) != 0 {
		t.Fatalf("second start with the same definition: %+v, %v; want no change", changes, err)
	}

	o.MaxBytes = 64 << 20
	if changes, err = eventbus.ReconcileStreams(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	if len(changes) != len(events.Streams(o)) {
		t.Fatalf("changes %+v, want every stream updated", changes)
	}
	for _, ch := range changes {
		if ch.Created || !slices.ContainsFunc(ch.Fields, func(f string) bool { return strings.HasPrefix(f, "MaxBytes ") }) {
			t.Errorf("%s: %+v, want an update of MaxBytes", ch.Stream, ch)
		}
	}
	for _, want := range events.Streams(o) {
		s, err := js.Stream(ctx, want.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.MaxBytes; got != 64<<20 {
			t.Errorf("%s: MaxBytes %d, want %d", want.Name, got, 64<<20)
		}
	}
}

// TestReconcileStreamsRefusedUpdateFails: a change the hub cannot make in
// place fails with the stream and the field named, and the stream is not
// reported as current.
func TestReconcileStreamsRefusedUpdateFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	js := hubJetStream(t)
	if _, err := eventbus.ReconcileStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	o := events.DefaultStreamOptions()
	o.Storage = jetstream.MemoryStorage
	_, err := eventbus.ReconcileStreams(ctx, js, o)
	if !errors.Is(err, eventbus.ErrStreamUpdateRefused) {
		t.Fatalf("storage change: %v, want ErrStreamUpdateRefused", err)
	}
	for _, want := range []string{events.StreamHealth, "Storage (File → Memory)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("a refused update was retried until the deadline: %v", err)
	}
}

// TestUntilSetSendsAnUnansweredRequestAgain: an attempt that gets no
// answer (a request a hub cluster electing its leaders dropped) ends at
// AttemptTimeout and is made again, within the caller's deadline; a
// considered refusal of the hub ends it at once.
func TestUntilSetSendsAnUnansweredRequestAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*eventbus.AttemptTimeout)
	defer cancel()
	attempts := 0
	begin := time.Now()
	err := eventbus.UntilSet(ctx, func(ctx context.Context) error {
		attempts++
		if attempts == 1 {
			<-ctx.Done() // never answered
			return ctx.Err()
		}
		return nil
	})
	if err != nil || attempts != 2 {
		t.Fatalf("UntilSet: %v after %d attempts, want success at the second", err, attempts)
	}
	t.Logf("the second attempt succeeded %s after the first began", time.Since(begin).Round(10*time.Millisecond))
	attempts = 0
	refused := &jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use with a different configuration"}
	if err := eventbus.UntilSet(t.Context(), func(context.Context) error { attempts++; return refused }); !errors.Is(err, refused) || attempts != 1 {
		t.Fatalf("UntilSet with a refusal: %v after %d attempts, want the refusal at once", err, attempts)
	}
}
