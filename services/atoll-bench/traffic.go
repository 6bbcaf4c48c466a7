package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/sitesim"
	"github.com/atoll-edge/atoll/test/testbed"
)

// linkBytes are the bytes a node's server moved over its unit routes and
// its leaf link to the hub.
type linkBytes struct{ routeIn, routeOut, leafIn, leafOut, leafOutMsgs int64 }

func sample(n *sitesim.Node) linkBytes {
	var b linkBytes
	srv := n.NATS().Server()
	if rz, err := srv.Routez(nil); err == nil {
		for _, r := range rz.Routes {
			b.routeIn += r.InBytes
			b.routeOut += r.OutBytes
		}
	}
	if lz, err := srv.Leafz(&server.LeafzOptions{}); err == nil {
		for _, l := range lz.Leafs {
			b.leafIn += l.InBytes
			b.leafOut += l.OutBytes
			b.leafOutMsgs += l.OutMsgs
		}
	}
	return b
}

// wire is the size of one message on a route or leaf connection: the
// protocol line, the header block and the payload.
func wire(subject string, m proto.Message, id string) int {
	msg, err := events.NewMsg(subject, m, id)
	if err != nil {
		panic(err)
	}
	hdr := len("NATS/1.0\r\n\r\n")
	for k, vs := range msg.Header {
		for _, v := range vs {
			hdr += len(k) + 2 + len(v) + 2
		}
	}
	line := len("HMSG $G ") + len(subject) + 1 + len(strconv.Itoa(hdr)) + 1 + len(strconv.Itoa(hdr+len(msg.Data))) + 2
	return line + hdr + len(msg.Data) + 2
}

// model gives a node's bytes per second for a unit of n healthy nodes at
// the default settings: each report goes to every peer over routes and
// stays in the unit; the node's ballot (its verdicts on the other members)
// goes to the hub once per keep-alive when nothing changes.
func model(unit string, n int) (report, ballot int, routeOut, leafOut float64) {
	p, v := prober.DefaultConfig(), voter.DefaultConfig()
	r := &atollv1.ProbeReport{Checker: unit + "-1", Unit: unit, ReportTime: timestamppb.Now(), Sequence: 12345, Period: durationpb.New(p.Period)}
	for i := 1; i <= n; i++ {
		r.Peers = append(r.Peers, &atollv1.PeerResult{Node: fmt.Sprintf("%s-%d", unit, i), Normal: true, Score: 100, Scoreline: p.Scoreline})
	}
	subj, _ := events.ProbeSubject(unit, r.Checker)
	report = wire(subj, r, r.Checker+"@lz8x1k2j3-12345")
	b := &atollv1.Ballot{Voter: unit + "-1", Unit: unit, Members: uint32(n), Time: timestamppb.Now(), Ttl: durationpb.New(v.TTL), Keepalive: true}
	for i := 2; i <= n; i++ {
		b.Votes = append(b.Votes, &atollv1.Vote{Node: fmt.Sprintf("%s-%d", unit, i), Verdict: atollv1.Verdict_VERDICT_HEALTHY,
			Normal: uint32(n - 1), Since: timestamppb.Now()})
	}
	bsubj, _ := events.BallotSubject(unit, b.Voter)
	ballot = wire(bsubj, b, b.Voter+"@18c2d4e5f6a7b8c9")
	period, keepalive := p.Period.Seconds(), v.KeepAlive.Seconds()
	routeOut = float64((n-1)*report) / period
	leafOut = float64(ballot) / keepalive
	return report, ballot, routeOut, leafOut
}

// trafficUnit is the unit whose traffic is measured.
const trafficUnit = "traffic"

func traffic(ctx context.Context, out io.Writer, bed *testbed.Bed, o options) error {
	unit := trafficUnit
	nodes, err := bed.Sites.AddSite(ctx, unit, o.trafficSize)
	if err != nil {
		return err
	}
	// Let membership, routes and verdicts settle before measuring.
	if _, err := poll(ctx, 2*time.Minute, func() bool {
		for _, n := range nodes {
			if bed.Health.Tally(n.Name).Verdict != atollv1.Verdict_VERDICT_HEALTHY || len(n.NATS().Status().RoutedPeers) != len(nodes)-1 {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("traffic unit never settled: %w", err)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(5 * time.Second): // past the first burst of ballots
	}
	before := make([]linkBytes, len(nodes))
	for i, n := range nodes {
		before[i] = sample(n)
	}
	start := time.Now()
	if err := o.progress.wait(ctx, fmt.Sprintf("traffic: measuring %d nodes", len(nodes)), o.window); err != nil {
		return err
	}
	secs := time.Since(start).Seconds()
	var sum linkBytes
	for i, n := range nodes {
		after := sample(n)
		sum.routeIn += after.routeIn - before[i].routeIn
		sum.routeOut += after.routeOut - before[i].routeOut
		sum.leafIn += after.leafIn - before[i].leafIn
		sum.leafOut += after.leafOut - before[i].leafOut
		sum.leafOutMsgs += after.leafOutMsgs - before[i].leafOutMsgs
	}
	per := func(v int64) float64 { return float64(v) / float64(len(nodes)) / secs }

	// What the probe messages do not explain is the servers' own chatter
	// (system account events, pings): per route for routes, per node for
	// the leaf. The model carries it over to other unit sizes.
	_, _, mr, ml := model(unit, len(nodes))
	routeOther := (per(sum.routeOut) - mr) / float64(len(nodes)-1)
	leafOther := per(sum.leafOut) - ml

	fmt.Fprintf(out, "\nprobe traffic per node, bytes/s (reports every %v, ballot keep-alive every %v)\n", prober.DefaultConfig().Period, voter.DefaultConfig().KeepAlive)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "unit size\thow\treport bytes\tballot bytes\tunit routes out (= in)\tleaf to hub (out)\tall links, both ways")
	fmt.Fprintf(w, "%d\tmeasured over %v\t-\t-\t%.0f (in %.0f)\t%.0f (in %.0f)\t%.0f\n", len(nodes), o.window,
		per(sum.routeOut), per(sum.routeIn), per(sum.leafOut), per(sum.leafIn), per(sum.routeOut+sum.routeIn+sum.leafOut+sum.leafIn))
	for _, n := range []int{10, 50, 200} {
		rb, vb, ro, lo := model(unit, n)
		ro += routeOther * float64(n-1)
		lo += leafOther
		fmt.Fprintf(w, "%d\tmodel\t%d\t%d\t%.0f\t%.0f\t%.0f\n", n, rb, vb, ro, lo, 2*ro+lo+per(sum.leafIn))
	}
	_ = w.Flush()
	fmt.Fprintf(out, "server chatter besides probe messages, measured at %d nodes: %.0f B/s per route, %.0f B/s on the leaf\n", len(nodes), routeOther, leafOther)
	// The calibration of bench:scale's emulated agents (scale.go's
	// emulateAgent): what real agents send the hub in a steady unit, next
	// to what an emulated one publishes.
	measured, emulated := per(sum.leafOutMsgs), emulatedRate()
	fmt.Fprintf(out, "messages to the hub per node/s in a steady unit: real agents %.4f, bench:scale's emulated agents %.4f (real/emulated %.2f)\n",
		measured, emulated, measured/emulated)
	return nil
}
