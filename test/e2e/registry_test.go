package e2e

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestRegistryLost brings atoll-cloud back without its identity registry
// (the bucket deleted while every replica was down, as a new hub volume
// or a lost bucket would leave it; the identity keys kept, as the Secret
// atoll-cloud-identity keeps them). The nodes' credentials still link;
// each agent, its unit view listing no key for it, renews, and the cloud
// records its key again: every peer's report counts again, and a node cut
// from the cloud is then protected (verdict healthy, never tainted
// NoExecute past its toleration).
func TestRegistryLost(t *testing.T) {
	e := startShape(t, hubCluster)
	nodes := e.site(t, "k1", 3, true)
	keys := map[string]string{}
	for _, n := range nodes {
		k, ok := e.bed.Identity.NodeKey(n)
		if !ok {
			t.Fatalf("no key recorded for %s", n)
		}
		keys[n] = k
	}
	ctx := t.Context()
	before := time.Now()
	if err := e.bed.StopCloud(ctx); err != nil {
		t.Fatal(err)
	}
	nc, err := e.bed.HubCluster.ClientConfig().Dialer("test", slog.New(slog.DiscardHandler))(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, e.bed.HubCluster.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, identity.Bucket); err != nil {
		t.Fatal(err)
	}
	if err := e.bed.StartCloud(ctx); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	poll.Eventually(t, 2*time.Minute, func() error {
		for _, n := range nodes {
			if k, ok := e.bed.Identity.NodeKey(n); !ok || k != keys[n] {
				return fmt.Errorf("%s: key %q recorded, want %q", n, k, keys[n])
			}
			// Recorded again, not kept: the bucket was lost.
			if r, _ := e.bed.Identity.Record(n); !r.Issued.After(before) {
				return fmt.Errorf("%s: record issued %v, before the bucket was deleted", n, r.Issued)
			}
			if j := e.bed.Health.Tally(n); int(j.Checkers) != len(nodes)-1 {
				return fmt.Errorf("%s: %d of the %d other checkers' reports count", n, j.Checkers, len(nodes)-1)
			}
		}
		return nil
	})
	t.Logf("every key recorded again and every report counted %s after the restart", time.Since(restarted).Round(100*time.Millisecond))

	cut := nodes[0]
	e.partition(t, cut)
	e.waitUnknown(t, cut)
	poll.Eventually(t, 30*time.Second, func() error { return e.verdict(cut, wellknown.VerdictHealthy) })
	holdsFor(t, toleration+10*time.Second, func() error {
		n, err := e.node(cut)
		if err != nil {
			return err
		}
		if hasTaint(n, corev1.TaintEffectNoExecute) {
			return fmt.Errorf("%s tainted unreachable:NoExecute though its peers see it healthy", cut)
		}
		return nil
	})
}
