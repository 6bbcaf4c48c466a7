package eventbus_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestViewsHoldsMoreThanAThousandConsumers: nats-server (≥ 2.12) bounds a
// stream that declares no MaxConsumers to 1,000, whatever the server or
// account allows; every edge agent follows VIEWS with consumers of its
// own, so the 201st node of an installation was refused. A VIEWS stream
// made before the bound was declared refuses the 1,001st consumer, the
// next start reconciles it, and then it accepts more. On one hub server
// and on a 3-server hub (the clustered create is another code path).
func TestViewsHoldsMoreThanAThousandConsumers(t *testing.T) {
	tests := []struct {
		name    string
		connect func(t *testing.T) (*nats.Conn, string, int)
	}{
		{"single", func(t *testing.T) (*nats.Conn, string, int) {
			h := natstest.Hub(t)
			nc, _ := natstest.CloudJetStream(t, h)
			return nc, h.Domain(), 1
		}},
		{"cluster", func(t *testing.T) (*nats.Conn, string, int) {
			c := natstest.NewHubCluster(t)
			nc, err := c.Connect(c.Server(0), "test")
			if err != nil {
				t.Fatal(err)
			}
			return nc, c.Domain(), natstest.ClusterSize
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
			defer cancel()
			nc, domain, replicas := tc.connect(t)
			t.Cleanup(nc.Close)
			js, err := jetstream.NewWithDomain(nc, domain)
			if err != nil {
				t.Fatal(err)
			}
			o := events.DefaultStreamOptions()
			o.Replicas, o.Storage = replicas, jetstream.MemoryStorage

			// VIEWS with the server's default bound.
			old := viewsConfig(t, o)
			if old.MaxConsumers != events.ViewsMaxConsumers {
				t.Fatalf("VIEWS declares MaxConsumers %d, want %d", old.MaxConsumers, events.ViewsMaxConsumers)
			}
			old.MaxConsumers = 0
			// A cluster places an R3 stream once its servers have met.
			poll.Eventually(t, time.Minute, func() error {
				_, err := js.CreateStream(ctx, old)
				return err
			})
			s, err := js.Stream(ctx, events.StreamViews)
			if err != nil {
				t.Fatal(err)
			}
			// The bound is the server's, not in the stream's configuration
			// (which reports -1).
			const limit = 1000
			create := func(i int) error {
				_, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{
					Name: fmt.Sprintf("c%d", i), AckPolicy: jetstream.AckNonePolicy,
					MemoryStorage: true, Replicas: 1, InactiveThreshold: 10 * time.Minute,
				})
				return err
			}
			for i := range limit {
				if err := create(i); err != nil {
					t.Fatalf("consumer %d of %d: %v", i+1, limit, err)
				}
			}
			if err := create(limit); err == nil || !strings.Contains(err.Error(), "maximum consumers") {
				t.Fatalf("consumer %d on the old VIEWS: %v, want refused for the maximum", limit+1, err)
			}

			reconcileChanges(t, ctx, js, o, "MaxConsumers")
			for i := limit; i < limit+5; i++ {
				if err := create(i); err != nil {
					t.Fatalf("consumer %d after the reconcile: %v", i+1, err)
				}
			}
		})
	}
}

// viewsConfig is VIEWS' configuration as Streams(o) declares it.
func viewsConfig(t *testing.T, o events.StreamOptions) jetstream.StreamConfig {
	t.Helper()
	for _, s := range events.Streams(o) {
		if s.Name == events.StreamViews {
			return s
		}
	}
	t.Fatal("no VIEWS in events.Streams")
	return jetstream.StreamConfig{}
}

// reconcileChanges reconciles the hub's streams and fails unless VIEWS'
// field was among what changed.
func reconcileChanges(t *testing.T, ctx context.Context, js jetstream.JetStream, o events.StreamOptions, field string) {
	t.Helper()
	changes, err := eventbus.ReconcileStreams(ctx, js, o)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range changes {
		if ch.Stream == events.StreamViews && strings.Contains(strings.Join(ch.Fields, ","), field) {
			return
		}
	}
	t.Fatalf("reconcile changed %+v, want VIEWS' %s", changes, field)
}
