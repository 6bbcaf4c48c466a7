package eventbus_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// lastValueHub starts a hub with Atoll's streams and returns its JetStream
// and the VIEWS stream.
func lastValueHub(t *testing.T) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	h := natstest.Hub(t)
	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	return js, st
}

// unitViews returns a LastValue of unit views that stamps the time on a
// copy, counting the stamps (one per publish).
func unitViews(js jetstream.JetStream, stamps *atomic.Int32, o ...func(*eventbus.LastValueOptions[*atollv1.UnitView])) *eventbus.LastValue[*atollv1.UnitView] {
	opts := eventbus.LastValueOptions[*atollv1.UnitView]{
		Stamp: func(v *atollv1.UnitView) *atollv1.UnitView {
			stamps.Add(1)
			m := proto.Clone(v).(*atollv1.UnitView)
			m.Time = timestamppb.Now()
			return m
		},
		Empty: func(v *atollv1.UnitView) bool { return len(v.GetMembers()) == 0 },
	}
	for _, f := range o {
		f(&opts)
	}
	return eventbus.NewLastValue(func() jetstream.JetStream { return js }, events.StreamViews, opts)
}

// view is unit u's view with members named names and fingerprint fp.
func view(u, fp string, names ...string) *atollv1.UnitView {
	v := &atollv1.UnitView{Unit: u, Fingerprint: fp}
	for _, n := range names {
		v.Members = append(v.Members, &atollv1.UnitMember{Name: n})
	}
	return v
}

// last is the fingerprint and sequence of subj's last message.
func last(t *testing.T, st jetstream.Stream, subj string) (string, uint64) {
	t.Helper()
	raw, err := st.GetLastMsgForSubject(context.Background(), subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var v atollv1.UnitView
	if err := proto.Unmarshal(raw.Data, &v); err != nil {
		t.Fatal(err)
	}
	return v.GetFingerprint(), raw.Sequence
}

func mustPut(t *testing.T, lv *eventbus.LastValue[*atollv1.UnitView], subj string, v *atollv1.UnitView) eventbus.PutResult {
	t.Helper()
	res, err := lv.Put(context.Background(), subj, v)
	if err != nil {
		t.Fatalf("put %s %s: %v", subj, v.GetFingerprint(), err)
	}
	return res
}

// TestLastValueStoresChangesOnly: content the stream holds is not stored
// again, whether remembered or read from the stream, and a value that
// returns to earlier content is stored again.
func TestLastValueStoresChangesOnly(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	var stamps atomic.Int32
	lv := unitViews(js, &stamps)

	res := mustPut(t, lv, subj, view("u1", "fp-a", "n1"))
	fpA, seqA := last(t, st, subj)
	if !res.Changed || fpA != "fp-a" || res.Replaced.Seq != 0 || res.Bytes == 0 {
		t.Fatalf("first put: %+v, stream holds %q", res, fpA)
	}
	if got, ok := lv.Known(subj); !ok || got.Seq != seqA || got.Fingerprint != "fp-a" {
		t.Fatalf("remembered %+v %v, want seq %d fp-a", got, ok, seqA)
	}

	// The same content, remembered: nothing stored.
	res = mustPut(t, lv, subj, view("u1", "fp-a", "n1"))
	if res.Changed || !res.Remembered || res.Replaced.Seq != seqA {
		t.Fatalf("unchanged put (remembered): %+v", res)
	}
	// The same content, by a writer that knows nothing (read from the
	// stream): nothing stored.
	res = mustPut(t, unitViews(js, &stamps), subj, view("u1", "fp-a", "n1"))
	if res.Changed || res.Remembered || res.Replaced.Seq != seqA {
		t.Fatalf("unchanged put (read): %+v", res)
	}
	if _, seq := last(t, st, subj); seq != seqA {
		t.Fatalf("stream's last sequence %d, want %d: unchanged content was stored", seq, seqA)
	}
	if n := stamps.Load(); n != 1 {
		t.Fatalf("%d publishes, want 1", n)
	}

	// A → B → A inside the duplicate window: A is stored again.
	if res = mustPut(t, lv, subj, view("u1", "fp-b", "n1", "n2")); !res.Changed || res.Replaced.Seq != seqA {
		t.Fatalf("put B: %+v", res)
	}
	if res = mustPut(t, lv, subj, view("u1", "fp-a", "n1")); !res.Changed || res.Republished != 0 {
		t.Fatalf("put A again: %+v", res)
	}
	if fp, seq := last(t, st, subj); fp != "fp-a" || seq <= seqA {
		t.Fatalf("stream holds %q at %d, want fp-a after %d", fp, seq, seqA)
	}
}

// TestLastValueEmpty: an empty value is not stored where the subject holds
// nothing, and is stored over a value that is not empty.
func TestLastValueEmpty(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	var stamps atomic.Int32
	lv := unitViews(js, &stamps)

	if res := mustPut(t, lv, subj, view("u1", "fp-empty")); res.Changed {
		t.Fatalf("empty put on a bare subject stored: %+v", res)
	}
	if _, seq := last(t, st, subj); seq != 0 {
		t.Fatalf("bare subject holds sequence %d", seq)
	}
	mustPut(t, lv, subj, view("u1", "fp-a", "n1"))
	if res := mustPut(t, lv, subj, view("u1", "fp-empty")); !res.Changed {
		t.Fatalf("empty put over a value not stored: %+v", res)
	}
	got, err := unitViews(js, &stamps).Last(context.Background(), subj)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Empty || got.Fingerprint != "fp-empty" {
		t.Fatalf("read back %+v, want the empty value", got)
	}
}

// TestLastValueConcurrentWriter: a writer whose remembered value another
// writer replaced has its publish refused (wrong last sequence), reads the
// stream and decides again.
func TestLastValueConcurrentWriter(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	var stamps atomic.Int32
	a, b := unitViews(js, &stamps), unitViews(js, &stamps)

	mustPut(t, a, subj, view("u1", "fp-1", "n1"))
	mustPut(t, b, subj, view("u1", "fp-2", "n2"))
	_, seq2 := last(t, st, subj)

	// a remembers fp-1: its publish of fp-3 expects fp-1's sequence.
	res := mustPut(t, a, subj, view("u1", "fp-3", "n3"))
	if !res.Changed || !res.Remembered || res.Conflicts != 1 || res.Replaced.Seq != seq2 || res.Replaced.Fingerprint != "fp-2" {
		t.Fatalf("put over b's value: %+v, want stored after 1 conflict, replacing seq %d", res, seq2)
	}
	if fp, _ := last(t, st, subj); fp != "fp-3" {
		t.Fatalf("stream holds %q, want fp-3", fp)
	}

	// b remembers fp-2; the stream holds fp-3, which b now puts: the
	// conflict's read finds the content stored, and nothing is.
	_, seq3 := last(t, st, subj)
	res = mustPut(t, b, subj, view("u1", "fp-3", "n3"))
	if res.Changed || res.Conflicts != 1 || res.Replaced.Seq != seq3 {
		t.Fatalf("put of the stored content: %+v, want nothing stored after 1 conflict", res)
	}
	if _, seq := last(t, st, subj); seq != seq3 {
		t.Fatalf("stream's last sequence %d, want %d", seq, seq3)
	}
}

// TestLastValueRepublishesPurgedCopy: a value whose id matches a copy the
// stream has since lost (purged) is acknowledged as a duplicate; Put sees
// that the subject does not hold it and publishes it again under a
// one-off id.
func TestLastValueRepublishesPurgedCopy(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	var stamps atomic.Int32
	lv := unitViews(js, &stamps)
	ctx := context.Background()

	mustPut(t, lv, subj, view("u1", "fp-a", "n1"))
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
		t.Fatal(err)
	}
	lv.ForgetAll()
	// Same content over nothing: the id is the purged copy's.
	res := mustPut(t, lv, subj, view("u1", "fp-a", "n1"))
	if !res.Changed || res.Republished != 1 {
		t.Fatalf("put after purge: %+v, want stored after 1 duplicate", res)
	}
	if fp, seq := last(t, st, subj); fp != "fp-a" || seq == 0 {
		t.Fatalf("stream holds %q at %d, want fp-a", fp, seq)
	}
	if got, _ := lv.Known(subj); got.Fingerprint != "fp-a" {
		t.Fatalf("remembered %+v", got)
	}
}

// TestLastValueReplacesUndecodable: a stored message that does not decode
// is replaced.
func TestLastValueReplacesUndecodable(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	if _, err := js.Publish(context.Background(), subj, []byte{0xff, 0xff, 0xff}); err != nil {
		t.Fatal(err)
	}
	var stamps atomic.Int32
	res := mustPut(t, unitViews(js, &stamps), subj, view("u1", "fp-a", "n1"))
	if !res.Changed || res.Replaced.Seq == 0 || res.Replaced.Fingerprint != "" {
		t.Fatalf("put over garbage: %+v", res)
	}
	if fp, _ := last(t, st, subj); fp != "fp-a" {
		t.Fatalf("stream holds %q, want fp-a", fp)
	}
}

// TestLastValueNeedsFingerprint: a message without a fingerprint is
// refused with an error naming the field, and nothing is stored.
func TestLastValueNeedsFingerprint(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	var stamps atomic.Int32
	_, err := unitViews(js, &stamps).Put(context.Background(), subj, view("u1", "", "n1"))
	if err == nil || !strings.Contains(err.Error(), "fingerprint") {
		t.Fatalf("err = %v, want one naming the fingerprint", err)
	}
	if _, seq := last(t, st, subj); seq != 0 || stamps.Load() != 0 {
		t.Fatalf("stored at %d after %d publishes, want nothing", seq, stamps.Load())
	}
}

// rivalJS stores another value on the subject right before every
// publish, as a writer that always wins the race would.
type rivalJS struct {
	jetstream.JetStream
	rivals atomic.Int32
}

func (r *rivalJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	n := r.rivals.Add(1)
	b, _ := proto.Marshal(view("u1", "rival-"+string('a'+n), "r"))
	if _, err := r.JetStream.Publish(ctx, msg.Subject, b); err != nil {
		return nil, err
	}
	return r.JetStream.PublishMsg(ctx, msg, opts...)
}

// TestLastValueAttemptsBounded: a subject that changes under every
// publish makes Put give up after MaxAttempts publishes, with an error
// naming the subject, and forget the subject.
func TestLastValueAttemptsBounded(t *testing.T) {
	js, st := lastValueHub(t)
	subj, _ := events.UnitViewSubject("u1")
	rival := &rivalJS{JetStream: js}
	var stamps atomic.Int32
	lv := eventbus.NewLastValue(func() jetstream.JetStream { return rival }, events.StreamViews, eventbus.LastValueOptions[*atollv1.UnitView]{
		MaxAttempts: 3,
		Stamp:       func(v *atollv1.UnitView) *atollv1.UnitView { stamps.Add(1); return v },
	})
	res, err := lv.Put(context.Background(), subj, view("u1", "fp-a", "n1"))
	if !errors.Is(err, eventbus.ErrKeptChanging) || !strings.Contains(err.Error(), subj) || !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("err = %v, want ErrKeptChanging naming %s and 3 attempts", err, subj)
	}
	if res.Changed || res.Conflicts != 3 || res.PublishFailed || stamps.Load() != 3 {
		t.Fatalf("result %+v after %d publishes, want 3 conflicts and publishes", res, stamps.Load())
	}
	if _, ok := lv.Known(subj); ok {
		t.Fatal("subject still remembered after giving up")
	}
	if fp, _ := last(t, st, subj); !strings.HasPrefix(fp, "rival-") {
		t.Fatalf("stream holds %q, want the rival's value", fp)
	}
}
