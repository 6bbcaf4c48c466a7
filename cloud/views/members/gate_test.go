package members

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestDeletedNodeLosesHubLink: deleting an edge's Kubernetes Node closes
// its live leaf link to the embedded hub within seconds and keeps it out;
// when the kubelet registers the Node again, the edge is let back in.
// Other edges keep their links throughout.
func TestDeletedNodeLosesHubLink(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("members-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	log := natstest.Logger(t, slog.LevelInfo)
	sys, err := identity.DialSystem(ctx, h.ClientConfig(), h.Issuer(), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	ids, err := identity.NewService(identity.DefaultConfig(), h.Issuer(), nc, sys, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ids.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ids.Stop() })
	enrolled := enrolledHub{h, ids}
	e1 := natstest.Edge(t, enrolled, "e1", natstest.EdgeOptions{Unit: "u1"})
	natstest.Edge(t, enrolled, "e2", natstest.EdgeOptions{Unit: "u1"})
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	n1 := kubeNode("e1", map[string]string{wellknown.LabelUnit: "u1"}, "10.0.0.1")
	for _, n := range []any{n1, kubeNode("e2", map[string]string{wellknown.LabelUnit: "u1"}, "10.0.0.2")} {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	cfg := DefaultConfig()
	cfg.Debounce = 0
	s, err := New(cfg, hublink.Of(nc, js), corelisters.NewNodeLister(idx), natstest.Logger(t, slog.LevelInfo), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetEdgeGate(ids)
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	linked := func(want map[string]bool) {
		t.Helper()
		poll.Eventually(t, 10*time.Second, func() error {
			lz, err := h.Server().Leafz(&server.LeafzOptions{})
			if err != nil {
				return err
			}
			got := map[string]bool{}
			for _, l := range lz.Leafs {
				got[l.Name] = true
			}
			for node, up := range want {
				if got[node] != up {
					return fmt.Errorf("%s linked = %v, want %v", node, got[node], up)
				}
			}
			return nil
		})
	}
	linked(map[string]bool{"e1": true, "e2": true})
	s.Changed()
	// The service has listed both Nodes once it published their unit.
	poll.Eventually(t, 10*time.Second, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if !s.listed["e1"] || !s.listed["e2"] {
			return fmt.Errorf("nodes listed: %v", s.listed)
		}
		return nil
	})

	if err := idx.Delete(n1); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.NodeChanged("e1") // the incremental path: only e1 is recomputed
	linked(map[string]bool{"e1": false, "e2": true})
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("link closed %v after the Node was deleted, want within 5s", d)
	}
	// It stays out across several of its reconnect attempts (1 s apart).
	wctx, wcancel := context.WithTimeout(context.Background(), 3500*time.Millisecond)
	defer wcancel()
	_ = poll.Until(wctx, func(context.Context) error {
		if e1.Status().HubConnected {
			t.Fatal("edge of a deleted Node reconnected")
		}
		return fmt.Errorf("watching")
	})

	// The kubelet registers the Node again.
	if err := idx.Add(n1); err != nil {
		t.Fatal(err)
	}
	s.NodeChanged("e1")
	linked(map[string]bool{"e1": true, "e2": true})
}

// enrolledHub issues the edges' credentials through the identity service,
// which records their keys (what Suspend revokes).
type enrolledHub struct {
	*hub.Hub
	ids *identity.Service
}

func (e enrolledHub) IssueEdge(node, unit, pub string) (string, error) {
	return e.ids.IssueEdge(context.Background(), node, unit, pub)
}
