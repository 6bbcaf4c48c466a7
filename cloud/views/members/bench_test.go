package members

import (
	"fmt"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// BenchmarkEvent times one event of each kind the service handles, at
// 1,000 and 10,000 nodes in units of 10, after the first (full) pass: a
// Node event (a node's InternalIP changes) and an agent's topology report
// (its route URL changes). Each op is the event plus the pass it causes,
// including the publish of the one view that changed; the cost should not
// grow with the number of nodes. Run on a quiet machine:
//
//	go test -run '^$' -bench BenchmarkEvent -benchtime 2000x ./cloud/views/members/
func BenchmarkEvent(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		f := newKubeFixture(b, unitNodes(n/10, 10))
		s := f.svc
		if err := s.pass(b.Context()); err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("kind=node/nodes=%d", n), func(b *testing.B) {
			for i := range b.N {
				// A node of a unit in the middle changes its address.
				node := kubeNode("n50-5", map[string]string{wellknown.LabelUnit: "u50"}, fmt.Sprintf("10.9.%d.%d", i/250%250, i%250+1))
				if err := f.idx.Update(node); err != nil {
					b.Fatal(err)
				}
				s.NodeChanged("n50-5")
				if err := s.pass(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("kind=report/nodes=%d", n), func(b *testing.B) {
			for i := range b.N {
				s.observe(&atollv1.TopologyUpdate{Node: "n60-3", Unit: "u60", RouteUrl: fmt.Sprintf("nats-route://10.8.0.1:%d", 1024+i%60000)}, time.Now())
				if err := s.pass(b.Context()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
