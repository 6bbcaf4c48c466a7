package tunnel_test

import (
	"github.com/atoll-edge/atoll/cloud/units"

	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

type noHealth struct{}

func (noHealth) Tally(string) health.Tally                      { return health.Tally{} }
func (noHealth) Protected(string) bool                          { return false }
func (noHealth) UnitState(string) (health.UnitState, time.Time) { return "", time.Time{} }

// TestStatusCountsSessionsOfEveryReplica: sessions held by two tunnel
// server replicas show in `atoll status` (the status endpoint, answered by
// either replica) as their sum per node, and go back to zero when they end.
func TestStatusCountsSessionsOfEveryReplica(t *testing.T) {
	r := setup(t)
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range []string{"n1", "n2"} {
		if err := idx.Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{wellknown.LabelUnit: "u1"}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i, s := range r.servers {
		resp, err := status.New(noHealth{}, corelisters.NewNodeLister(idx), units.DefaultRule(), natstest.Logger(t, slog.LevelWarn))
		if err != nil {
			t.Fatal(err)
		}
		resp.SetTunnels(s)
		resp.SetGather(time.Second) // generous on a loaded machine: both must answer
		if err := resp.Start(r.serverNCs[i]); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Stop() })
	}
	// sessions asks several times (the queue group picks either replica)
	// until every answer counts want sessions to n1 from two replicas.
	sessions := func(want uint32) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok := true
			var got *atollv1.ClusterStatus
			for range 4 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				var cs atollv1.ClusterStatus
				err := events.Request(ctx, r.serverNCs[0], events.StatusSubject, &atollv1.StatusRequest{}, &cs)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				got = &cs
				nodes := cs.GetUnits()[0].GetNodes()
				if cs.GetTunnelReplicas() != 2 || nodes[0].GetTunnelSessions() != want || nodes[1].GetTunnelSessions() != 0 {
					ok = false
					break
				}
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("status never counted %d sessions to n1 from 2 replicas; last: %v", want, got)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	sessions(0)
	var conns []net.Conn
	for i, n := range []int{2, 3} {
		for range n {
			c, code, body := r.connect(t, i, "n1:"+r.kubeletPort)
			if c == nil {
				t.Fatalf("CONNECT through replica %d: %d %s", i, code, body)
			}
			conns = append(conns, c)
		}
	}
	sessions(5)
	for _, c := range conns {
		c.Close()
	}
	sessions(0)
}
