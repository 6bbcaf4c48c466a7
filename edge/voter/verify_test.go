package voter

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/poll"
)

// warnCounter is a slog handler that counts WARN records by message.
type warnCounter struct {
	mu  sync.Mutex
	got map[string]int
}

func (w *warnCounter) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnCounter) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got[r.Message]++
	return nil
}
func (w *warnCounter) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnCounter) WithGroup(string) slog.Handler      { return w }

func (w *warnCounter) count(msg string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got[msg]
}

// publishRaw publishes r on its checker's subject with the given
// signature header (none when sig is nil: unsigned), as a peer's server
// sees it on the unit mesh.
func publishRaw(t *testing.T, nc *nats.Conn, r *atollv1.ProbeReport, sign func(*nats.Msg)) {
	t.Helper()
	subj, err := events.ProbeSubject(r.GetUnit(), r.GetChecker())
	if err != nil {
		t.Fatal(err)
	}
	msg, err := events.NewMsg(subj, r, "")
	if err != nil {
		t.Fatal(err)
	}
	if sign != nil {
		sign(msg)
	}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
}

// TestUnverifiedReportsDropped: on a real unit mesh, b's server publishes
// a report claiming to be c's (signed with b's own key), an unsigned
// report in b's name, and a report of d, a member whose key the view does
// not publish. Each is dropped and counted by reason, and each checker and
// reason is logged once: the verdict on a stays what the genuine reports
// of b and c say. Accepted, the forged reports (dated ahead of the genuine
// ones, so they would shadow them) would make a unhealthy.
func TestUnverifiedReportsDropped(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tick, cfg.KeepAlive = 50*time.Millisecond, time.Second
	mem := newMembers("u1", "a", "b", "c", "d")
	mem.view.Members[3].NodeKey = "" // d: no key known to the cloud
	warns := &warnCounter{got: map[string]int{}}
	v, pub, seen := unitLogging(t, cfg, mem, slog.New(warns))

	allNormal := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	aDown := map[string]bool{"a": false, "b": true, "c": true, "d": true}
	signAs := func(who string) func(*nats.Msg) {
		return func(m *nats.Msg) {
			if err := events.SignMsg(m, keyOf(who)); err != nil {
				t.Fatal(err)
			}
		}
	}
	poll.Eventually(t, 15*time.Second, func() error {
		now := time.Now()
		ahead := now.Add(500 * time.Millisecond)                   // within the skew
		publishRaw(t, pub, report("c", ahead, aDown), signAs("b")) // forged: b speaks as c
		publishRaw(t, pub, report("b", ahead, aDown), nil)         // unsigned
		publishRaw(t, pub, report("d", ahead, aDown), signAs("d")) // d has no published key
		publishReport(t, pub, report("b", now, allNormal))
		publishReport(t, pub, report("c", now, allNormal))
		if vote := seen.of("a"); vote.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY || vote.GetNormal() != 2 || vote.GetAbnormal() != 0 {
			return fmt.Errorf("vote on a = %v %d/%d, want healthy 2/0", vote.GetVerdict(), vote.GetNormal(), vote.GetAbnormal())
		}
		for _, reason := range []string{reasonBadSignature, reasonUnsigned, reasonNoKey} {
			if n := count(v.metrics.unverified.WithLabelValues(reason)); n < 5 {
				return fmt.Errorf("unverified{reason=%s} = %v, want at least 5", reason, n)
			}
		}
		return nil
	})
	if n := warns.count("dropping probe reports that fail verification"); n != 3 {
		t.Errorf("%d warnings about unverified reports, want 3 (one per checker and reason)", n)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for checker, r := range v.reports {
		for _, p := range r.GetPeers() {
			if p.GetNode() == "a" && !p.GetNormal() {
				t.Errorf("voter kept a forged report of %s", checker)
			}
		}
	}
}

// TestLimiter: one event per key and interval; the held-back ones are
// reported with the next one let through.
func TestLimiter(t *testing.T) {
	l := newLimiter(time.Minute)
	t0 := time.Unix(1000, 0)
	if ok, _ := l.allow("k", t0); !ok {
		t.Fatal("first event held back")
	}
	for i := range 3 {
		if ok, _ := l.allow("k", t0.Add(time.Duration(i+1)*time.Second)); ok {
			t.Fatal("event within the interval let through")
		}
	}
	if ok, _ := l.allow("other", t0); !ok {
		t.Fatal("another key held back")
	}
	if ok, n := l.allow("k", t0.Add(time.Minute)); !ok || n != 3 {
		t.Fatalf("after the interval: %v, %d held back; want true, 3", ok, n)
	}
}

// FuzzReceive: arbitrary subjects, payloads and signature headers go
// through the voter's path for reports from the unit mesh (decode, then
// receive) without a panic, and the voter keeps a report only if its
// checker's published key verifies it.
func FuzzReceive(f *testing.F) {
	now := time.Unix(1_000_000, 0)
	genuine := &atollv1.ProbeReport{Checker: "n2", Unit: "u1", ReportTime: timestamppb.New(now), Peers: []*atollv1.PeerResult{{Node: "n1", Normal: true}}}
	data, _ := proto.Marshal(genuine)
	subj := "atoll.health.probe.u1.n2"
	sig := func(who string) string {
		m := &nats.Msg{Subject: subj, Data: data}
		_ = events.SignMsg(m, keyOf(who))
		return m.Header.Get(events.HeaderSignature)
	}
	f.Add(subj, data, sig("n2"))
	f.Add(subj, data, sig("n3"))
	f.Add(subj, data, "")
	f.Add("atoll.health.probe.u1.n3", data, sig("n2"))
	f.Add(subj, []byte{0x0a, 0x02, 'n', '2'}, "AAAA")
	f.Fuzz(func(t *testing.T, subject string, payload []byte, header string) {
		v := offline(t, now, "n1", "n2", "n3")
		msg := &nats.Msg{Subject: subject, Data: payload, Header: nats.Header{}}
		if header != "" {
			msg.Header.Set(events.HeaderSignature, header)
		}
		r := &atollv1.ProbeReport{}
		if err := events.DecodeMsg(msg, r); err != nil {
			return // the subscription drops it before the voter
		}
		v.receive(eventbus.Event[*atollv1.ProbeReport]{Subject: subject, Msg: r, Header: msg.Header, Data: payload})
		v.mu.Lock()
		defer v.mu.Unlock()
		for checker := range v.reports {
			if err := events.Verify(subject, msg.Header, payload, pubOf(checker)); err != nil {
				t.Fatalf("kept a report of %s that does not verify: %v", checker, err)
			}
		}
	})
}
