package eventbus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
)

// StreamChange is what ReconcileStreams did to one stream.
type StreamChange struct {
	Stream  string
	Created bool
	// Fields are the fields an update changed, "Field (old → new)".
	Fields []string
}

// ErrStreamUpdateRefused is wrapped by ReconcileStreams when the hub will
// not apply a stream definition (a change it cannot make in place, such as
// the storage type or the retention policy). The hub keeps the old stream;
// the caller must not run against it as if it were current.
var ErrStreamUpdateRefused = errors.New("stream update refused")

// ReconcileStreams brings every hub stream to its definition in Streams(o):
// a missing stream is created, a stream whose definition differs is
// updated, one that matches is left alone. JetStream that is not available
// yet (a hub cluster still electing its leader, a hub server restarting) is
// retried until ctx is done. An update the hub refuses, or accepts without
// applying, is an error naming the stream and the fields: a stream is
// never left silently stale.
func ReconcileStreams(ctx context.Context, js jetstream.JetStream, o events.StreamOptions) ([]StreamChange, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var changes []StreamChange
	for _, want := range events.Streams(o) {
		var ch StreamChange
		err := UntilSet(ctx, func(ctx context.Context) error {
			var err error
			ch, err = reconcileStream(ctx, js, want)
			return err
		})
		if err != nil {
			return changes, fmt.Errorf("ensure stream %s: %w", want.Name, err)
		}
		if ch.Created || len(ch.Fields) > 0 {
			changes = append(changes, ch)
		}
	}
	return changes, nil
}

func reconcileStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (StreamChange, error) {
	ch := StreamChange{Stream: want.Name}
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if _, err := js.CreateStream(ctx, want); err != nil {
			return ch, fmt.Errorf("create: %w", err)
		}
		ch.Created = true
		return ch, nil
	}
	if err != nil {
		return ch, err
	}
	diff := streamDiff(s.CachedInfo().Config, want)
	if len(diff) == 0 {
		return ch, nil
	}
	ch.Fields = diff
	s, err = js.UpdateStream(ctx, want)
	if err != nil {
		if final(err) {
			return ch, fmt.Errorf("%w: the hub will not change %s: %w", ErrStreamUpdateRefused, strings.Join(diff, ", "), err)
		}
		return ch, fmt.Errorf("update %s: %w", strings.Join(diff, ", "), err)
	}
	if kept := streamDiff(s.CachedInfo().Config, want); len(kept) > 0 {
		return ch, fmt.Errorf("%w: the hub accepted the update but kept %s", ErrStreamUpdateRefused, strings.Join(kept, ", "))
	}
	return ch, nil
}

// streamDiff lists the fields Atoll defines on which have and want differ,
// as "Field (have → want)". Unset limits (0) equal the server's -1.
func streamDiff(have, want jetstream.StreamConfig) []string {
	var out []string
	add := func(field string, h, w any) {
		if h != w {
			out = append(out, fmt.Sprintf("%s (%v → %v)", field, h, w))
		}
	}
	limit := func(v int64) int64 {
		if v == 0 {
			return -1
		}
		return v
	}
	add("Description", have.Description, want.Description)
	hs, ws := slices.Sorted(slices.Values(have.Subjects)), slices.Sorted(slices.Values(want.Subjects))
	add("Subjects", strings.Join(hs, ","), strings.Join(ws, ","))
	add("Retention", have.Retention, want.Retention)
	add("Storage", have.Storage, want.Storage)
	add("Replicas", max(have.Replicas, 1), max(want.Replicas, 1))
	add("MaxMsgs", limit(have.MaxMsgs), limit(want.MaxMsgs))
	add("MaxBytes", limit(have.MaxBytes), limit(want.MaxBytes))
	add("MaxMsgsPerSubject", limit(have.MaxMsgsPerSubject), limit(want.MaxMsgsPerSubject))
	add("MaxMsgSize", limit(int64(have.MaxMsgSize)), limit(int64(want.MaxMsgSize)))
	add("MaxConsumers", limit(int64(have.MaxConsumers)), limit(int64(want.MaxConsumers)))
	add("MaxAge", have.MaxAge, want.MaxAge)
	add("Discard", have.Discard, want.Discard)
	if want.Duplicates != 0 {
		add("Duplicates", have.Duplicates, want.Duplicates)
	}
	add("AllowRollup", have.AllowRollup, want.AllowRollup)
	add("AllowDirect", have.AllowDirect, want.AllowDirect)
	add("DenyDelete", have.DenyDelete, want.DenyDelete)
	add("DenyPurge", have.DenyPurge, want.DenyPurge)
	add("RePublish", republishString(have.RePublish), republishString(want.RePublish))
	return out
}

// republishString is r as streamDiff shows it ("none" when unset).
func republishString(r *jetstream.RePublish) string {
	if r == nil {
		return "none"
	}
	s := r.Source + ":" + r.Destination
	if r.HeadersOnly {
		s += " (headers only)"
	}
	return s
}

// final reports whether err is the hub's considered answer: a JetStream
// API error other than "temporarily unavailable" (503, e.g. a cluster
// electing its leader), a timeout, or "no suitable peers for placement"
// (a cluster whose servers have not all met yet: an R3 stream cannot be
// placed until they have). No responders and timeouts are not final.
func final(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch {
	case apiErr.Code == 503, apiErr.Code == 408:
		return false
	case apiErr.ErrorCode == jetstream.ErrorCode(errNoSuitablePeers):
		return false
	}
	return true
}

// errNoSuitablePeers is JetStream's JSClusterNoPeersErrF.
const errNoSuitablePeers = 10005

// retryTransient runs f until it succeeds, fails for good, or ctx is done.
func retryTransient(ctx context.Context, f func() error) error {
	wait := 100 * time.Millisecond
	for {
		err := f()
		if err == nil || errors.Is(err, ErrStreamUpdateRefused) || final(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// AttemptTimeout bounds one attempt of UntilSet: a JetStream API request
// the hub never answers (one that reached a cluster while it elected its
// leaders) is sent again instead of waiting out the caller's deadline.
const AttemptTimeout = 5 * time.Second

// UntilSet runs f, each time with a context bounded by AttemptTimeout, until
// it succeeds, fails for good (a considered answer of the hub, or
// ErrStreamUpdateRefused), or ctx is done; between attempts it waits 0.1 s
// doubling up to 2 s. For what a service sets up on the hub at start: its
// streams, its key-value buckets.
func UntilSet(ctx context.Context, f func(ctx context.Context) error) error {
	return retryTransient(ctx, func() error {
		actx, cancel := context.WithTimeout(ctx, AttemptTimeout)
		defer cancel()
		return f(actx)
	})
}

// EnsureStreams creates every hub stream or updates it to the current
// definition (see ReconcileStreams). It is safe to call from every replica
// at every start.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o events.StreamOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	_, err := ReconcileStreams(ctx, js, o)
	return err
}
