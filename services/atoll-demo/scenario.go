package main

import (
	"context"
	"time"

	"github.com/atoll-edge/atoll/test/testbed"
)

// scenario cuts one node's link to the cloud (its kubelet's Lease and its
// agent's leaf link) and later restores it, so the demo shows the node
// lifecycle controller losing the node and Atoll keeping it serving.
type scenario struct {
	o     options
	bed   *testbed.Bed
	say   func(string, ...any)
	start time.Time
	node  string
	state int // 0 waiting, 1 cut, 2 restored
}

func newScenario(o options, bed *testbed.Bed, say func(string, ...any)) *scenario {
	return &scenario{o: o, bed: bed, say: say, start: time.Now(), node: "site-a-1"}
}

func (s *scenario) step(ctx context.Context) {
	if s.o.cutAfter <= 0 {
		return
	}
	elapsed := time.Since(s.start)
	switch {
	case s.state == 0 && elapsed >= s.o.cutAfter:
		s.state = 1
		_ = s.bed.Kubelet.Partition(s.node)
		_ = s.bed.Sites.SetLeaf(s.node, false)
		s.say("\n>>> cut %s from the cloud (Lease renewals and hub link stop); its site peers still reach it", s.node)
	case s.state == 1 && elapsed >= s.o.cutAfter+s.o.cutFor:
		s.state = 2
		_ = s.bed.Sites.SetLeaf(s.node, true)
		_ = s.bed.Kubelet.Heal(s.node)
		s.say("\n>>> restored %s's cloud link", s.node)
	}
}
