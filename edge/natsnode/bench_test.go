package natsnode_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/testenv/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// report is a realistic probe report: a checker's view of 10 peers.
func report(checker string) *atollv1.ProbeReport {
	r := &atollv1.ProbeReport{Checker: checker, Unit: "u1", ReportTime: timestamppb.Now()}
	for i := range 10 {
		r.Peers = append(r.Peers, &atollv1.PeerResult{
			Node: fmt.Sprintf("node-%02d", i), Normal: true, Score: 100, Scoreline: 100,
			Plugins: []*atollv1.PluginResult{
				{Plugin: "tcp", Ok: true, Weight: 0.5, Score: 50, Attempts: 1},
				{Plugin: "http", Ok: true, Weight: 0.5, Score: 50, Attempts: 1},
			},
		})
	}
	return r
}

func percentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	at := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(at(0.50), "p50-µs")
	b.ReportMetric(at(0.99), "p99-µs")
}

// BenchmarkEdgeToHubJetStream measures an edge node publishing probe
// reports into the hub's HEALTH stream through its leaf link: "sync" waits
// for each stream ack (latency), "async" keeps up to 256 in flight
// (throughput).
func BenchmarkEdgeToHubJetStream(b *testing.B) {
	h := natstest.Hub(b)
	hnc, err := h.Connect("bench")
	if err != nil {
		b.Fatal(err)
	}
	defer hnc.Close()
	hjs, _ := jetstream.New(hnc)
	if err := events.EnsureStreams(context.Background(), hjs, events.DefaultStreamOptions()); err != nil {
		b.Fatal(err)
	}
	unit := natstest.Unit(b, h, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	nc, err := unit[0].Connect("bench")
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.NewWithDomain(nc, h.Domain())
	subj, _ := events.ProbeSubject("u1", "a")
	poll.Eventually(b, 10*time.Second, func() error {
		_, err := js.Publish(context.Background(), subj, nil)
		return err
	})
	r := report("a")
	data, _ := proto.Marshal(r)
	b.Logf("payload %d bytes", len(data))

	b.Run("sync", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			r.Sequence = uint64(i)
			start := time.Now()
			if _, err := events.PublishDurable(context.Background(), js, subj, r, fmt.Sprintf("s-%d-%d", b.N, i)); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		percentiles(b, lat)
	})
	b.Run("async", func(b *testing.B) {
		ajs, _ := jetstream.NewWithDomain(nc, h.Domain(), jetstream.WithPublishAsyncMaxPending(256))
		b.SetBytes(int64(len(data)))
		for i := 0; b.Loop(); i++ {
			r.Sequence = uint64(i)
			if _, err := events.PublishAsync(ajs, subj, r, fmt.Sprintf("a-%d-%d", b.N, i)); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-ajs.PublishAsyncComplete():
		case <-time.After(30 * time.Second):
			b.Fatal("async publishes not acked")
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	})
}

// BenchmarkUnitFanout measures unit-local delivery: node a publishes probe
// reports over core NATS and both unit peers receive each one over routes.
// Latency is publish → the second peer received it: "latency" sends one
// report at a time, "throughput" keeps up to 512 in flight.
func BenchmarkUnitFanout(b *testing.B) {
	b.Run("latency", func(b *testing.B) { benchFanout(b, 1) })
	b.Run("throughput", func(b *testing.B) { benchFanout(b, 512) })
}

func benchFanout(b *testing.B, window int) {
	h := natstest.Hub(b)
	unit := natstest.Unit(b, h, "u1", natstest.EdgeOptions{}, "a", "b", "c")
	subj, _ := events.ProbeSubject("u1", "a")
	var (
		mu   sync.Mutex
		got  = map[uint64]int{}
		lat  []time.Duration
		done atomic.Int64
	)
	waitLinks(b, true, unit)
	for i, peer := range unit[1:] {
		bit := 1 << i
		nc, err := peer.Connect("bench")
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			var r atollv1.ProbeReport
			if err := proto.Unmarshal(m.Data, &r); err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			got[r.GetSequence()] |= bit
			if got[r.GetSequence()] == 3 {
				lat = append(lat, time.Since(r.GetReportTime().AsTime()))
				delete(got, r.GetSequence())
				done.Add(1)
			}
		})
		if err != nil {
			b.Fatal(err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		_ = nc.Flush()
	}
	pub, err := unit[0].Connect("bench")
	if err != nil {
		b.Fatal(err)
	}
	defer pub.Close()
	r := report("a")
	poll.Eventually(b, 10*time.Second, func() error {
		r.Sequence, r.ReportTime = 1<<62, timestamppb.Now()
		_ = events.Publish(pub, subj, r, "")
		if done.Load() == 0 {
			return fmt.Errorf("peers not reached yet")
		}
		return nil
	})
	mu.Lock()
	lat, got = lat[:0], map[uint64]int{}
	mu.Unlock()
	done.Store(0)

	// At most window reports in flight, so that the measurement is of
	// delivery, not of slow-consumer drops.
	wait := func(n int64) {
		deadline := time.Now().Add(30 * time.Second)
		for done.Load() < n {
			if time.Now().After(deadline) {
				mu.Lock()
				pending := len(got)
				mu.Unlock()
				b.Fatalf("only %d of %d reports reached both peers (%d reached one)", done.Load(), n, pending)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i >= window {
			wait(int64(i - window + 1))
		}
		r.Sequence, r.ReportTime = uint64(i), timestamppb.Now()
		if err := events.Publish(pub, subj, r, ""); err != nil {
			b.Fatal(err)
		}
	}
	wait(int64(b.N))
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	mu.Lock()
	percentiles(b, lat)
	mu.Unlock()
}
