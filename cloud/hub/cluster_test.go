package hub_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestClusterSurvivesOneServer: three clustered hub servers with R3
// streams. An edge whose leaf remote lists all three keeps publishing into
// the hub's JetStream when the server its leaf is on dies, a cloud client
// that dialled all three keeps reading, and the killed server rejoins.
func TestClusterSurvivesOneServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := natstest.NewHubCluster(t)
	log := natstest.Logger(t, slog.LevelWarn)
	cloud := hublink.New(c.Domain(), c.ClientConfig().Dialer("cloud", log), log)
	if err := cloud.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cloud.Stop(context.Background()) })
	if err := eventbus.EnsureStreams(ctx, cloud.JetStream(), events.StreamOptions{Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}

	edge := natstest.Edge(t, c, "e1", natstest.EdgeOptions{})
	nc, err := edge.Connect("agent")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ejs, err := jetstream.NewWithDomain(nc, c.Domain())
	if err != nil {
		t.Fatal(err)
	}
	subject := "atoll.health.ballot.u1.e1"
	publish := func(i int) error {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := ejs.Publish(pctx, subject, fmt.Appendf(nil, "report %d", i), jetstream.WithMsgID(fmt.Sprint(i)))
		return err
	}
	poll.Eventually(t, 20*time.Second, func() error { return publish(1) })

	// The server the edge's leaf is on dies.
	on := -1
	for i := range natstest.ClusterSize {
		if h := c.Server(i); h != nil && h.Server().NumLeafNodes() > 0 {
			on = i
		}
	}
	if on < 0 {
		t.Fatal("the edge's leaf is on no hub server")
	}
	if err := c.Kill(on); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error { return publish(2) })
	for i := range natstest.ClusterSize {
		if h := c.Server(i); i != on && h.Server().NumLeafNodes() > 0 {
			t.Logf("leaf moved from server %d to %d", on, i)
		}
	}
	msgs := func(want uint64) func() error {
		return func() error {
			s, err := cloud.JetStream().Stream(ctx, events.StreamHealth)
			if err != nil {
				return err
			}
			if got := s.CachedInfo().State.Msgs; got != want {
				return fmt.Errorf("HEALTH holds %d messages, want %d", got, want)
			}
			return nil
		}
	}
	poll.Eventually(t, 20*time.Second, msgs(2))
	if err := c.Restart(ctx, on); err != nil {
		t.Fatal(err)
	}
	// The restarted server catches up: every replica is current again.
	poll.Eventually(t, 30*time.Second, func() error {
		s, err := cloud.JetStream().Stream(ctx, events.StreamHealth)
		if err != nil {
			return err
		}
		info := s.CachedInfo()
		if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
			return fmt.Errorf("cluster info %+v", info.Cluster)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("replica %s not current", r.Name)
			}
		}
		return nil
	})
	if err := publish(3); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, msgs(3))
}
