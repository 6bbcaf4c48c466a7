package agent_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestConsumersPerAgent: agents with every view follower on (membership,
// the hosts writer, the endpoints proxy) hold no consumer on VIEWS once
// their feeds have caught up (a consumer per agent costs the hub memory
// for every node of the fleet), and in a quiet window their leaf links carry to
// the hub only a report and a ballot keep-alive at most each.
func TestConsumersPerAgent(t *testing.T) {
	h, _ := cloud(t)
	quiet := func(c *edgeapp.Config) {
		c.Reporter.Period = time.Minute
		c.ViewFeed.CatchUpLinger = time.Second
		c.Proxy.Enabled, c.Proxy.Addr = true, "127.0.0.1:0"
		c.Hosts.Path = filepath.Join(t.TempDir(), "atoll.hosts")
	}
	var edges []edge
	for _, name := range []string{"a", "b"} {
		e, _ := startEdge(t, h, name, "u1", t.TempDir(), quiet)
		edges = append(edges, e)
	}
	waitMeshed(t, "u1", edges...)
	feeds := []string{"assignment", "unit_view", "hosts", "proxy_unit", "proxy_shared"}
	poll.Eventually(t, 30*time.Second, func() error {
		for _, e := range edges {
			for _, f := range feeds {
				if n := e.metric(t, "atoll_viewfeed_catchups_total", `feed="`+f+`"`); n < 1 {
					return fmt.Errorf("%s's %s feed has not caught up", e.node.Name(), f)
				}
			}
		}
		return nil
	})

	nc, err := h.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	consumers := func() error {
		s, err := js.Stream(t.Context(), events.StreamViews)
		if err != nil {
			return err
		}
		if n := s.CachedInfo().State.Consumers; n != 0 {
			return fmt.Errorf("VIEWS holds %d consumers", n)
		}
		return nil
	}
	poll.Eventually(t, 30*time.Second, consumers)

	fromLeafs := func() int64 {
		lz, err := h.Server().Leafz(nil)
		if err != nil {
			t.Fatal(err)
		}
		n := int64(0)
		for _, l := range lz.Leafs {
			n += l.InMsgs
		}
		return n
	}
	const window = 10 * time.Second
	before := fromLeafs()
	<-time.After(window) // a measurement window, not a wait for a state
	got := fromLeafs() - before
	t.Logf("%d messages from %d agents' leaf links in %v", got, len(edges), window)
	// A report (every minute here) and a ballot keep-alive (every 30 s)
	// per agent at most; no request for the views.
	if most := int64(2 * len(edges)); got > most {
		t.Errorf("%d messages from the agents in a quiet %v, want at most %d", got, window, most)
	}
	if err := consumers(); err != nil {
		t.Error(err)
	}
}
