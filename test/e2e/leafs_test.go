package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestHubServerLoss runs three units of three nodes on the hub cluster:
// every edge lists all three hub servers' leaf URLs, and the leafs spread
// over the servers (each holds some). Then the server holding the most
// leafs is killed: its leafs reconnect to the other two within seconds,
// every node's verdict stays healthy throughout (in atoll-cloud's vote
// state and on the Node) with every other member's vote counting, and the
// moved voters' ballots sent over their new connections are recorded.
// Then the killed server returns and another is stopped in lame duck
// mode, which reports every leaf it closes: the same holds.
func TestHubServerLoss(t *testing.T) {
	e := startShape(t, hubShape{name: "hub cluster", cluster: true, net: 5})
	units := []string{"lf1", "lf2", "lf3"}
	const perUnit = 3
	var nodes []string
	t.Run("sites", func(t *testing.T) {
		for _, u := range units {
			t.Run(u, func(t *testing.T) { t.Parallel(); e.site(t, u, perUnit, true) })
		}
	})
	if t.Failed() {
		return
	}
	for _, u := range units {
		for i := 1; i <= perUnit; i++ {
			nodes = append(nodes, fmt.Sprintf("%s-%d", u, i))
		}
	}
	c := e.bed.HubCluster

	// Spread: every server holds some of the edges' leafs.
	var placed map[string]int
	poll.Eventually(t, 30*time.Second, func() error {
		var err error
		if placed, err = leafPlacement(c, nodes); err != nil {
			return err
		}
		if len(placed) != len(nodes) {
			return fmt.Errorf("%d of %d edges linked: %v", len(placed), len(nodes), placed)
		}
		return nil
	})
	per := make([]int, natstest.ClusterSize)
	for _, i := range placed {
		per[i]++
	}
	t.Logf("leafs per hub server: %v", per)
	for i, n := range per {
		if n == 0 {
			t.Fatalf("hub server %d holds no edge leaf: %v", i, per)
		}
	}

	// Watch every verdict from before the kill to the end.
	healthy := func() error {
		list, err := e.client.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		annotated := map[string]string{}
		for _, n := range list.Items {
			annotated[n.Name] = n.Annotations[wellknown.AnnotationVerdict]
		}
		for _, n := range nodes {
			j := e.bed.Health.Tally(n)
			if j.Verdict != atollv1.Verdict_VERDICT_HEALTHY || j.Healthy != perUnit-1 {
				return fmt.Errorf("%s: cloud verdict %s with %d healthy votes, want healthy by its %d others", n, j.Verdict, j.Healthy, perUnit-1)
			}
			if v := annotated[n]; v != wellknown.VerdictHealthy {
				return fmt.Errorf("%s: verdict annotation %q", n, v)
			}
		}
		return nil
	}
	poll.Eventually(t, 30*time.Second, healthy)
	var (
		mu      sync.Mutex
		flipped error
		samples int
	)
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			err := healthy()
			mu.Lock()
			samples++
			if err != nil && flipped == nil {
				flipped = fmt.Errorf("%s after the kill: %w", time.Now().Format(time.TimeOnly), err)
			}
			mu.Unlock()
		}
	}()
	stopWatching := func() error {
		close(stop)
		<-watched
		mu.Lock()
		defer mu.Unlock()
		t.Logf("verdicts sampled %d times", samples)
		return flipped
	}

	victim := 0
	for i := range per {
		if per[i] > per[victim] {
			victim = i
		}
	}
	var moved []string
	for n, i := range placed {
		if i == victim {
			moved = append(moved, n)
		}
	}
	slices.Sort(moved)
	name := c.Server(victim).Name()
	killed := time.Now()
	if err := c.Kill(victim); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed hub server %s holding the leafs of %v (atoll-cloud was on %s)", name, moved, e.bed.HubLink.Conn().ConnectedServerName())

	// Moved: every edge is linked again, to the two others.
	poll.Eventually(t, 20*time.Second, func() error {
		now, err := leafPlacement(c, nodes)
		if err != nil {
			return err
		}
		if missing := len(nodes) - len(now); missing > 0 {
			return fmt.Errorf("%d edges not linked again: %v", missing, now)
		}
		return nil
	})
	took := time.Since(killed)
	now, _ := leafPlacement(c, nodes)
	t.Logf("the %d leafs of %s reconnected within %v: %v", len(moved), name, took.Round(100*time.Millisecond), now)
	if took > 15*time.Second {
		t.Errorf("leafs took %v to reconnect, want seconds", took)
	}

	// The moved voters' ballots over their new links are recorded and
	// count: their votes' publication on the new connection reached the
	// cloud, and every verdict is still healthy by all other members.
	poll.Eventually(t, 30*time.Second, func() error {
		for _, v := range moved {
			if at := e.bed.Health.LastBallot(v); !at.After(killed) {
				return fmt.Errorf("%s's latest recorded ballot was stored at %v, before the kill", v, at.Format(time.TimeOnly))
			}
		}
		return healthy()
	})
	for _, v := range moved {
		t.Logf("%s's ballot recorded %v after the kill", v, e.bed.Health.LastBallot(v).Sub(killed).Round(100*time.Millisecond))
	}
	// And they keep counting a while after.
	holdsFor(t, 5*time.Second, healthy)

	// A server stopped in lame duck mode (a rolling restart of the hub)
	// closes its leafs one at a time and reports each closed with the
	// reason "Server Shutdown": not a lost link, so no vote is cut while
	// they move. The killed server returns first (the hub's streams need
	// two of three servers); no leaf moves back to it.
	if err := c.Restart(t.Context(), victim); err != nil {
		t.Fatal(err)
	}
	placed, err := leafPlacement(c, nodes)
	if err != nil {
		t.Fatal(err)
	}
	per = make([]int, natstest.ClusterSize)
	for _, i := range placed {
		per[i]++
	}
	duck := (victim + 1) % natstest.ClusterSize
	if other := (victim + 2) % natstest.ClusterSize; per[other] > per[duck] {
		duck = other
	}
	moved = moved[:0]
	for n, i := range placed {
		if i == duck {
			moved = append(moved, n)
		}
	}
	slices.Sort(moved)
	name = c.Server(duck).Name()
	ducked := time.Now()
	if err := c.LameDuck(t.Context(), duck); err != nil {
		t.Fatal(err)
	}
	t.Logf("hub server %s stopped in lame duck mode in %v, holding the leafs of %v", name, time.Since(ducked).Round(100*time.Millisecond), moved)
	poll.Eventually(t, 20*time.Second, func() error {
		now, err := leafPlacement(c, nodes)
		if err != nil {
			return err
		}
		if missing := len(nodes) - len(now); missing > 0 {
			return fmt.Errorf("%d edges not linked again: %v", missing, now)
		}
		return nil
	})
	now, _ = leafPlacement(c, nodes)
	t.Logf("the %d leafs of %s linked again %v after lame duck mode began: %v", len(moved), name, time.Since(ducked).Round(100*time.Millisecond), now)
	poll.Eventually(t, 30*time.Second, func() error {
		for _, v := range moved {
			if at := e.bed.Health.LastBallot(v); !at.After(ducked) {
				return fmt.Errorf("%s's latest recorded ballot was stored at %v, before lame duck mode", v, at.Format(time.TimeOnly))
			}
		}
		return healthy()
	})
	holdsFor(t, 5*time.Second, healthy)
	if err := stopWatching(); err != nil {
		t.Fatalf("a verdict flipped: %v", err)
	}
}

// leafPlacement returns, for each of nodes linked to a running server of
// c, the index of that server.
func leafPlacement(c *natstest.HubCluster, nodes []string) (map[string]int, error) {
	out := map[string]int{}
	for i := range natstest.ClusterSize {
		h := c.Server(i)
		if h == nil {
			continue
		}
		lz, err := h.Server().Leafz(nil)
		if err != nil {
			return nil, fmt.Errorf("leafz of hub server %d: %w", i, err)
		}
		for _, l := range lz.Leafs {
			if slices.Contains(nodes, l.Name) {
				if j, dup := out[l.Name]; dup {
					return nil, fmt.Errorf("%s linked to hub servers %d and %d", l.Name, j, i)
				}
				out[l.Name] = i
			}
		}
	}
	return out, nil
}
