package health

import (
	"testing"
	"time"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestPruneWhenDue: Prune scans the votes only once something is due (a
// vote expiring, a ballot record or a cut to forget), not at every call;
// a vote with a shorter TTL recorded after a scan, a ballot and a cut
// each bring the next scan forward; what expired goes at the scan.
func TestPruneWhenDue(t *testing.T) {
	now := time.Unix(10_000, 0)
	tr := NewTracker(75 * time.Second)
	members := map[string]atollv1.Verdict{"x": healthy, "y": healthy}
	tr.ObserveBallot(ballot("a", now, 75*time.Second, members), now)
	scans := func() int { tr.mu.RLock(); defer tr.mu.RUnlock(); return tr.scans }
	tr.Prune(now) // the first scan sets what is due
	if scans() != 1 {
		t.Fatalf("%d scans after the first Prune, want 1", scans())
	}
	for s := time.Second; s <= 75*time.Second; s += 2 * time.Second {
		if n := tr.Prune(now.Add(s)); n != 0 {
			t.Fatalf("pruned %d at +%v, before any vote expired", n, s)
		}
	}
	if scans() != 1 {
		t.Fatalf("%d scans while nothing was due, want 1", scans())
	}
	// A vote that expires sooner, recorded after the scan.
	tr.ObserveBallot(ballot("b", now.Add(10*time.Second), 5*time.Second, map[string]atollv1.Verdict{"x": healthy}), now.Add(10*time.Second))
	if n := tr.Prune(now.Add(14 * time.Second)); n != 0 || scans() != 1 {
		t.Fatalf("before the short vote expired: pruned %d, %d scans", n, scans())
	}
	if n := tr.Prune(now.Add(16 * time.Second)); n != 1 || scans() != 2 {
		t.Fatalf("after the short vote expired: pruned %d, %d scans; want 1 and 2", n, scans())
	}
	if _, v := tr.Size(); v != 2 {
		t.Fatalf("%d votes kept, want a's 2", v)
	}
	// A cut drops its votes at once; its record is forgotten later.
	tr.Cut("a", now.Add(20*time.Second))
	if _, v := tr.Size(); v != 0 {
		t.Fatalf("%d votes after the cut", v)
	}
	if n := tr.Prune(now.Add(76 * time.Second)); n != 0 || scans() != 3 {
		t.Fatalf("at a's votes' expiry: pruned %d, %d scans; want 0 (cut already) and 3", n, scans())
	}
	// Everything forgotten in the end: the ballot record and the cut.
	tr.Prune(now.Add(time.Hour))
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	if len(tr.ballots) != 0 || len(tr.cuts) != 0 || len(tr.names) != 0 {
		t.Fatalf("after an hour: %d ballot records, %d cuts, %d names", len(tr.ballots), len(tr.cuts), len(tr.names))
	}
}

// TestBallotSeen: the shared ballot consumer skips, undecoded, a ballot
// the tracker recorded (or one stored before the voter's last recorded
// ballot), and decodes every other: a later one, an unknown voter's, one
// whose subject does not parse.
func TestBallotSeen(t *testing.T) {
	now := time.Unix(10_000, 0)
	s := &Service{tracker: NewTracker(75 * time.Second)}
	s.tracker.ObserveBallot(ballot("a", now, 75*time.Second, map[string]atollv1.Verdict{"x": healthy}), now)
	subj, err := events.BallotSubject("u1", "a")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := events.BallotSubject("u1", "b")
	for _, c := range []struct {
		subject string
		stored  time.Time
		want    bool
	}{
		{subj, now, true},
		{subj, now.Add(-time.Second), true},
		{subj, now.Add(time.Nanosecond), false},
		{other, now, false},
		{"atoll.health.ballot", now, false},
	} {
		if got := s.ballotSeen(c.subject, c.stored); got != c.want {
			t.Errorf("ballotSeen(%s, %v) = %v, want %v", c.subject, c.stored.Sub(now), got, c.want)
		}
	}
}
