package fabric_test

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestBlackholedLeaf: the kernel drops every packet of an edge's leaf
// link to the hub (nftables, both directions; nothing is closed, as when
// a NAT table forgets the connection or a cable is cut): with the
// default pings (every 4 s, 2 unanswered) both ends close the link within
// (2+1) × 4 s, measured from the first drop; once packets flow again the
// edge dials the hub again.
func TestBlackholedLeaf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (nftables)")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("nft not installed (go tool task netns:deps)")
	}
	h := natstest.Hub(t)
	edge := natstest.Edge(t, h, "e0", natstest.EdgeOptions{Unit: "u0"})
	hubLeafs := func() int {
		lz, err := h.Server().Leafz(nil)
		if err != nil {
			return -1
		}
		return lz.NumLeafs
	}
	edgeLinked := func() bool { return edge.HubLink().ID != 0 }
	poll.Eventually(t, 20*time.Second, func() error {
		if hubLeafs() != 1 || !edgeLinked() {
			return fmt.Errorf("hub holds %d leafs, edge linked %v", hubLeafs(), edgeLinked())
		}
		return nil
	})

	// A table of this test's own, dropping the leaf port's packets.
	table := fmt.Sprintf("atoll-blackhole-%d", os.Getpid())
	port := h.LeafURL().Port()
	if _, err := strconv.Atoi(port); err != nil {
		t.Fatalf("hub leaf port %q", port)
	}
	nft := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("nft", args...).CombinedOutput(); err != nil {
			t.Fatalf("nft %v: %v\n%s", args, err, out)
		}
	}
	nft("add", "table", "inet", table)
	t.Cleanup(func() { _ = exec.Command("nft", "delete", "table", "inet", table).Run() })
	nft("add", "chain", "inet", table, "out", "{ type filter hook output priority -10 ; }")
	nft("add", "rule", "inet", table, "out", "tcp", "dport", port, "drop")
	nft("add", "rule", "inet", table, "out", "tcp", "sport", port, "drop")
	cut := time.Now()

	bound := time.Duration(hub.DefaultMaxPingsOut+1) * hub.DefaultPingInterval
	if edgeBound := time.Duration(natsnode.DefaultHubMaxPingsOut+1) * natsnode.DefaultHubPingInterval; edgeBound > bound {
		bound = edgeBound
	}
	var hubSaw, edgeSaw time.Duration
	// The ping timers start up to a fifth late and fire on their own
	// schedule: allow one more interval than the bound before failing.
	poll.Eventually(t, bound+natsnode.DefaultHubPingInterval+2*time.Second, func() error {
		if hubSaw == 0 && hubLeafs() == 0 {
			hubSaw = time.Since(cut)
		}
		if edgeSaw == 0 && !edgeLinked() {
			edgeSaw = time.Since(cut)
		}
		if hubSaw == 0 || edgeSaw == 0 {
			return fmt.Errorf("after %v: hub holds %d leafs, edge linked %v", time.Since(cut).Round(time.Millisecond), hubLeafs(), edgeLinked())
		}
		return nil
	})
	t.Logf("blackholed leaf closed by the hub after %v, by the edge after %v (bound %v)", hubSaw.Round(time.Millisecond), edgeSaw.Round(time.Millisecond), bound)

	nft("delete", "table", "inet", table)
	healed := time.Now()
	poll.Eventually(t, 20*time.Second, func() error {
		if hubLeafs() != 1 || !edgeLinked() {
			return fmt.Errorf("hub holds %d leafs, edge linked %v", hubLeafs(), edgeLinked())
		}
		return nil
	})
	t.Logf("linked again %v after packets flowed", time.Since(healed).Round(time.Millisecond))
}
