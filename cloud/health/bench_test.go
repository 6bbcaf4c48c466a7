package health

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// BenchmarkTrackerEvent times one event of each kind the tracker
// handles, with 1,000 and 10,000 nodes in units of 10 each voting on its
// unit's other members: a ballot (recorded, and every node it names tallied
// again, as the consumers do) and a voter's link loss (its votes cut, the
// nodes judged again). The cost should not grow with the number of nodes.
// Run on a quiet machine:
//
//	go test -run '^$' -bench BenchmarkTrackerEvent ./cloud/health/
func BenchmarkTrackerEvent(b *testing.B) {
	const size = 10
	for _, n := range []int{1000, 10000} {
		tr := NewTracker(30 * time.Second)
		start := time.Unix(100000, 0)
		name := func(u, i int) string { return fmt.Sprintf("n%d-%d", u, i) }
		ballotOf := func(u, voter int, at time.Time) *atollv1.Ballot {
			verdicts := map[string]atollv1.Verdict{}
			for i := range size {
				if i != voter {
					verdicts[name(u, i)] = healthy
				}
			}
			b := ballot(name(u, voter), at, 75*time.Second, verdicts)
			b.Unit = fmt.Sprintf("u%d", u)
			return b
		}
		for u := range n / size {
			for v := range size {
				tr.ObserveBallot(ballotOf(u, v, start), start)
			}
		}
		at := start
		b.Run(fmt.Sprintf("kind=ballot/nodes=%d", n), func(b *testing.B) {
			for range b.N {
				at = at.Add(time.Millisecond)
				for _, node := range tr.ObserveBallot(ballotOf(50, 3, at), at) {
					if j := tr.Tally(node, at, size, nil); j.Verdict != healthy {
						b.Fatalf("%s judged %v", node, j.Verdict)
					}
				}
			}
		})
		b.Run(fmt.Sprintf("kind=linkloss/nodes=%d", n), func(b *testing.B) {
			for range b.N {
				at = at.Add(time.Millisecond)
				for _, node := range tr.Cut(name(60, 4), at) {
					tr.Tally(node, at, size, nil)
				}
				at = at.Add(time.Millisecond)
				tr.ObserveBallot(ballotOf(60, 4, at), at)
			}
		})
	}
}

// BenchmarkTrackerMemory measures what the tracker holds at 10,000
// nodes in units of 180 (55 units, 9,900 nodes, each voting on its unit's
// other members: 1.77 million votes), the ballots decoded from the wire
// as the consumers do: heap bytes and heap objects per vote after a
// collection. Run on a quiet machine:
//
//	go test -run '^$' -bench BenchmarkTrackerMemory -benchtime 1x -count 3 ./cloud/health/
func BenchmarkTrackerMemory(b *testing.B) {
	const units, size = 55, 180
	at := time.Unix(100000, 0)
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		tr := NewTracker(30 * time.Second)
		for u := range units {
			for v := range size {
				verdicts := make(map[string]atollv1.Verdict, size-1)
				for i := range size {
					if i != v {
						verdicts[fmt.Sprintf("n%d-%d", u, i)] = healthy
					}
				}
				sent := ballot(fmt.Sprintf("n%d-%d", u, v), at, 75*time.Second, verdicts)
				sent.Unit = fmt.Sprintf("u%d", u)
				tr.ObserveBallot(viaWire(b, sent), at)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		_, votes := tr.Size()
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(votes), "B/vote")
		b.ReportMetric(float64(int64(after.HeapObjects)-int64(before.HeapObjects))/float64(votes), "objects/vote")
		b.ReportMetric(float64(votes), "votes")
		runtime.KeepAlive(tr)
	}
}

// BenchmarkKeepAlive times one keep-alive ballot of a voter in a unit of
// 180 (179 votes, from the wire), recorded by Refresh and, for
// comparison, the way any other ballot goes (Changing, then
// ObserveBallot).
func BenchmarkKeepAlive(b *testing.B) {
	const size, units = 180, 10
	name := func(u, i int) string { return fmt.Sprintf("n%d-%03d", u, i) }
	ballotOf := func(u, voter int, at time.Time) *atollv1.Ballot {
		bl := &atollv1.Ballot{Voter: name(u, voter), Unit: fmt.Sprintf("u%d", u), Time: timestamppb.New(at), Ttl: durationpb.New(75 * time.Second), Members: size}
		for i := range size {
			if i != voter {
				bl.Votes = append(bl.Votes, &atollv1.Vote{Node: name(u, i), Verdict: healthy, Normal: size - 2, Since: timestamppb.New(at)})
			}
		}
		return viaWire(b, bl)
	}
	for _, path := range []string{"refresh", "observe"} {
		b.Run("path="+path, func(b *testing.B) {
			tr := NewTracker(30 * time.Second)
			start := time.Unix(100000, 0)
			for u := range units {
				for v := range size {
					tr.ObserveBallot(ballotOf(u, v, start), start)
				}
			}
			at := start
			b.ReportAllocs()
			for b.Loop() {
				at = at.Add(time.Millisecond)
				b.StopTimer()
				bl := ballotOf(3, 7, at)
				b.StartTimer()
				if path == "refresh" {
					if !tr.Refresh(bl, at) {
						b.Fatal("a keep-alive not refreshed")
					}
					continue
				}
				if len(tr.Changing(bl, at)) != 0 || len(tr.ObserveBallot(bl, at)) != 0 {
					b.Fatal("a keep-alive changed votes")
				}
			}
		})
	}
}
