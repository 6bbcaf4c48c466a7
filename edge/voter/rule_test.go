package voter

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

// offline returns a voter that is not running: Observe and Evaluate work,
// nothing is sent.
func offline(t *testing.T, now time.Time, names ...string) *Voter {
	t.Helper()
	cfg := DefaultConfig()
	v, err := New(cfg, "n1", newMembers("u1", names...), nil, natstest.Logger(t, slog.LevelError), nil, eventbus.NewMetrics(nil))
	if err != nil {
		t.Fatal(err)
	}
	v.now = func() time.Time { return now }
	view := membership.View{Unit: "u1"}
	for _, n := range names {
		view.Members = append(view.Members, &atollv1.UnitMember{Name: n, NodeKey: pubOf(n)})
	}
	v.setMembers(view)
	return v
}

// TestRuleTable: the verdict about n1 in units of one to seven members,
// from the reports of the others — normal (N), abnormal (A), stale (S),
// future-dated (F) or missing (-) — while n1 always reports itself normal,
// which never counts.
func TestRuleTable(t *testing.T) {
	H, U, X := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY, atollv1.Verdict_VERDICT_NONE
	tests := []struct {
		others string // one letter per other member
		want   atollv1.Verdict
	}{
		{"", X}, // a unit of one: its own report is all there is
		{"N", H},
		{"A", U},
		{"S", X},
		{"F", X},
		{"-", X},
		{"NN", H},
		{"NS", X},
		{"NF", X},
		{"N-", X},
		{"AA", U},
		{"NA", X},
		{"NN-", H},
		{"NSF", X},
		{"NAA", U},
		{"NAS", X},
		{"AF-", X},
		{"NNNS", H},
		{"NNSF", X},
		{"NNAA", X},
		{"AAA-", U},
		{"NNN--", H},
		{"NNSSF", X},
		{"NNAAF", X},
		{"NNNN--", H},
		{"NNNSSF", X},
		{"NNNAAA", X},
		{"AAAAN-", U},
		{"FFFFFF", X},
	}
	now := time.Unix(100000, 0)
	cfg := DefaultConfig()
	for _, tt := range tests {
		members := len(tt.others) + 1
		t.Run(fmt.Sprintf("%d members %s", members, tt.others), func(t *testing.T) {
			names := []string{"n1"}
			for i := range tt.others {
				names = append(names, fmt.Sprintf("n%d", i+2))
			}
			v := offline(t, now, names...)
			all := map[string]bool{}
			for _, n := range names {
				all[n] = true
			}
			v.Observe(report("n1", now, all)) // its own: never counts
			for i, state := range tt.others {
				checker := names[i+1]
				at := now
				switch state {
				case '-':
					continue
				case 'S':
					at = now.Add(-cfg.Timeout - cfg.Skew - time.Second)
				case 'F':
					at = now.Add(cfg.Skew + time.Minute)
				}
				// A checker reports n1 as its letter says and every
				// other node abnormal, so only n1's count is checked.
				res := map[string]bool{}
				for _, n := range names {
					res[n] = false
				}
				res["n1"] = state != 'A'
				v.Observe(report(checker, at, res))
			}
			v.Evaluate()
			if got, ok := v.Verdict("n1"); !ok || got != tt.want {
				t.Fatalf("verdict on n1 = %v (%v), want %v", got, ok, tt.want)
			}
		})
	}
}

// TestFutureReportRejected: a report dated an hour ahead is rejected and
// counted, not kept; kept, it would shadow the checker's real reports (only
// newer reports replace a kept one) for an hour.
func TestFutureReportRejected(t *testing.T) {
	now := time.Unix(100000, 0)
	v := offline(t, now, "n1", "n2")
	v.Observe(report("n2", now.Add(time.Hour), map[string]bool{"n1": false}))
	if n := count(v.metrics.ignored.WithLabelValues("future")); n != 1 {
		t.Fatalf("future reports counted: %v, want 1", n)
	}
	v.Observe(report("n2", now, map[string]bool{"n1": true}))
	v.Evaluate()
	if got, _ := v.Verdict("n1"); got != atollv1.Verdict_VERDICT_HEALTHY {
		t.Fatalf("verdict on n1 after a real report = %v, want healthy (the future one shadows it)", got)
	}
	if n := count(v.metrics.ignored.WithLabelValues("not_newer")); n != 0 {
		t.Fatalf("the real report was ignored as not newer %v times", n)
	}
}

// TestForgetsDepartedNodes: 10,000 nodes join the unit, report, are voted
// on (with the link down, so their ballots wait in the sender) and leave;
// the voter's state returns to its size before them.
func TestForgetsDepartedNodes(t *testing.T) {
	now := time.Unix(100000, 0)
	base := []string{"n1", "n2", "n3"}
	v := offline(t, now, base...)
	h := natstest.Hub(t)
	nc, err := h.Connect("voter")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// A sender that never runs: what it is given waits, as with the link
	// down.
	out, err := newSender(v.cfg, nc, v.log, v.metrics, v.now)
	if err != nil {
		t.Fatal(err)
	}
	v.out = out
	all := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	view := func(names ...string) membership.View {
		mv := membership.View{Unit: "u1"}
		for _, n := range names {
			mv.Members = append(mv.Members, &atollv1.UnitMember{Name: n})
		}
		return mv
	}
	for _, c := range base {
		v.Observe(report(c, now, all(base...)))
	}
	v.Evaluate()
	r0, s0, w0 := v.Tracked()
	if r0 != 3 || s0 != 3 || w0 == 0 {
		t.Fatalf("baseline: %d reports, %d votes, %d waiting; want 3, 3, some", r0, s0, w0)
	}
	for i := range 10000 {
		x := fmt.Sprintf("x%d", i)
		names := append(append([]string{}, base...), x)
		v.setMembers(view(names...))
		v.Observe(report(x, now, all(names...)))
		v.Observe(report("n2", now.Add(time.Duration(i+1)*time.Millisecond), all(names...)))
		v.Evaluate()
		if _, ok := v.Verdict(x); !ok {
			t.Fatalf("cycle %d: no vote on %s", i, x)
		}
		v.setMembers(view(base...))
	}
	if r, s, w := v.Tracked(); r != r0 || s != s0 || w != w0 {
		t.Fatalf("after 10000 join/leave cycles: %d reports, %d votes, %d waiting; want %d, %d, %d", r, s, w, r0, s0, w0)
	}
	for node := range v.sent {
		if strings.HasPrefix(node, "x") {
			t.Fatalf("vote state kept about departed %s", node)
		}
	}
}
