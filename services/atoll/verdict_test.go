package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

var verdictAt = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

func vts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(verdictAt.Add(d)) }

// Nodes in the states the verdict tells apart.
func okNode(name string) *atollv1.NodeStatus {
	return &atollv1.NodeStatus{Name: name, Ready: "True", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 2}
}

func cutNode(name string) *atollv1.NodeStatus { // cloud link lost, peers healthy, kept
	return &atollv1.NodeStatus{Name: name, Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 2, Protected: true, ViewsBehind: "unit view"}
}

func deadNode(name string) *atollv1.NodeStatus {
	return &atollv1.NodeStatus{Name: name, Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_UNHEALTHY, UnhealthyVotes: 2}
}

// refusedNode is a Ready node whose probe credentials peer refuses.
func refusedNode(name, peer string) *atollv1.NodeStatus {
	return with(okNode(name), func(n *atollv1.NodeStatus) {
		n.ProbeRefusals = []*atollv1.ProbeRefusal{{Plugin: "kubelet-healthz", Peer: peer, Status: "401 Unauthorized"}}
	})
}

func with(n *atollv1.NodeStatus, f func(*atollv1.NodeStatus)) *atollv1.NodeStatus { f(n); return n }

func unit(name, state string, nodes ...*atollv1.NodeStatus) *atollv1.UnitStatus {
	return &atollv1.UnitStatus{Unit: name, State: state, Nodes: nodes}
}

func cluster(units ...*atollv1.UnitStatus) *atollv1.ClusterStatus {
	return &atollv1.ClusterStatus{Time: vts(0), Replica: "atoll-hub-0", Units: units}
}

// TestVerdict: the first line of `atoll status` for safe, degraded and
// at-risk selections, and the --exit-code each gives.
func TestVerdict(t *testing.T) {
	held := unit("site-b", "FullDisruption", with(cutNode("b1"), func(n *atollv1.NodeStatus) { n.Verdict = atollv1.Verdict_VERDICT_NONE }))
	held.HoldUntil = vts(9*time.Minute + 58*time.Second)
	released := unit("site-c", "FullDisruption", &atollv1.NodeStatus{Name: "c1", Ready: "Unknown"})
	released.HoldUntil = vts(-3 * time.Second)
	tests := []struct {
		name string
		cs   *atollv1.ClusterStatus
		unit string
		want string
		code int
	}{
		{"all ready", cluster(unit("site-a", "Normal", okNode("a1"), okNode("a2")), unit("site-b", "Normal", okNode("b1"), okNode("b2"))), "",
			"SAFE: 2 units, 4 nodes; every node Ready; no unit partitioned", 0},
		{"one unit asked for", cluster(unit("site-a", "Normal", okNode("a1"), okNode("a2"))), "site-a",
			"SAFE: unit site-a, 2 nodes; every node Ready; no unit partitioned", 0},
		{"cut nodes protected", cluster(unit("site-a", "PartialDisruption", okNode("a1"), cutNode("a2"), cutNode("a3")), unit("site-b", "PartialDisruption", cutNode("b1"), okNode("b2"))), "",
			"SAFE: 2 units, 5 nodes; 3 nodes protected (cloud link lost, peers healthy); no unit partitioned", 0},
		{"a lone node has no peers to judge it", cluster(unit("solo", "Normal", &atollv1.NodeStatus{Name: "s1", Ready: "True", ViewsBehind: "unknown"})), "",
			"SAFE: 1 unit, 1 node; every node Ready; no unit partitioned", 0},
		{"a peer lost: the others' verdicts lack its votes", cluster(unit("site-a", "PartialDisruption", cutNode("a1"),
			with(okNode("a2"), func(n *atollv1.NodeStatus) { n.Verdict, n.HealthyVotes = atollv1.Verdict_VERDICT_NONE, 1 }),
			with(okNode("a3"), func(n *atollv1.NodeStatus) { n.Verdict, n.HealthyVotes = atollv1.Verdict_VERDICT_NONE, 1 }))), "",
			"SAFE: 1 unit, 3 nodes; 1 node protected (cloud link lost, peers healthy); no unit partitioned", 0},
		{"no peer verdict", cluster(unit("site-a", "Normal", okNode("a1"), with(okNode("a2"), func(n *atollv1.NodeStatus) { n.Verdict = atollv1.Verdict_VERDICT_NONE }))), "",
			"DEGRADED: 1 unit, 2 nodes; node a2 has no peer verdict; every node Ready; no unit partitioned", ExitDegraded},
		{"ready but unhealthy by its peers, views behind, one protected", cluster(unit("site-a", "PartialDisruption",
			with(okNode("a1"), func(n *atollv1.NodeStatus) { n.Verdict = atollv1.Verdict_VERDICT_UNHEALTHY }),
			with(okNode("a2"), func(n *atollv1.NodeStatus) { n.ViewsBehind = "assignment" }),
			with(okNode("a3"), func(n *atollv1.NodeStatus) { n.ViewsBehind = "assignment, unit view" }),
			cutNode("a4"))), "",
			"DEGRADED: 1 unit, 4 nodes; node a1 Ready but unhealthy by its peers; nodes a2, a3 behind on their views; 1 node protected (cloud link lost, peers healthy); no unit partitioned", ExitDegraded},
		{"probe credentials refused by a Ready peer", cluster(unit("site-a", "Normal", refusedNode("a1", "a2"), okNode("a2"))), "",
			"DEGRADED: 1 unit, 2 nodes; node a1's kubelet probe credentials refused by a2 (401 Unauthorized): fix --kubelet-token-file (get nodes/healthz); every node Ready; no unit partitioned", ExitDegraded},
		{"probe credentials of several nodes refused", cluster(unit("site-a", "Normal", refusedNode("a1", "a2"), refusedNode("a2", "a2"), refusedNode("a3", "gone"))), "",
			"DEGRADED: 1 unit, 3 nodes; kubelet probe credentials of nodes a1, a2, a3 refused by their peers: fix --kubelet-token-file (get nodes/healthz); every node Ready; no unit partitioned", ExitDegraded},
		{"no key recorded for reporting agents", cluster(unit("site-a", "Normal",
			with(okNode("a1"), func(n *atollv1.NodeStatus) { n.NoKey = true }), with(okNode("a2"), func(n *atollv1.NodeStatus) { n.NoKey = true }), okNode("a3"))), "",
			"DEGRADED: 1 unit, 3 nodes; nodes a1, a2 have no key recorded by the cloud: their peers drop their reports; every node Ready; no unit partitioned", ExitDegraded},
		{"probe credentials refused by a lost peer: its kubelet cannot verify them", cluster(unit("site-a", "PartialDisruption", refusedNode("a1", "a2"), cutNode("a2"), okNode("a3"))), "",
			"SAFE: 1 unit, 3 nodes; 1 node protected (cloud link lost, peers healthy); no unit partitioned", 0},
		{"partitioned, held", cluster(unit("site-a", "Normal", okNode("a1"), okNode("a2")), held), "",
			"AT RISK: 2 units, 3 nodes; unit site-b partitioned (hold ends 10:09:58 UTC, in 9m58s)", ExitAtRisk},
		{"partitioned, hold ended, and a dead node", cluster(unit("site-a", "PartialDisruption", okNode("a1"), deadNode("a2")), released), "",
			"AT RISK: 2 units, 3 nodes; unit site-c partitioned (hold ended 09:59:57 UTC: released to Kubernetes); node a2 unhealthy by its peers", ExitAtRisk},
		{"lost without a verdict, not protected", cluster(unit("site-a", "PartialDisruption", okNode("a1"), &atollv1.NodeStatus{Name: "a2", Ready: "Unknown"}, cutNode("a3"))), "",
			"AT RISK: 1 unit, 3 nodes; node a2 lost by the cloud and not protected (no peer verdict); 1 node protected (cloud link lost, peers healthy); no unit partitioned", ExitAtRisk},
		{"not ready by its own kubelet, peers healthy", cluster(unit("site-a", "PartialDisruption", okNode("a1"), with(okNode("a2"), func(n *atollv1.NodeStatus) { n.Ready = "False" }))), "",
			"AT RISK: 1 unit, 2 nodes; node a2 not ready by its own kubelet: left to Kubernetes; no unit partitioned", ExitAtRisk},
		{"every agent cut from the hub, kubelets report", cluster(unit("site-a", "AgentsSilent",
			with(okNode("a1"), func(n *atollv1.NodeStatus) { n.Verdict, n.HealthyVotes = atollv1.Verdict_VERDICT_NONE, 0 }),
			with(okNode("a2"), func(n *atollv1.NodeStatus) { n.Verdict, n.HealthyVotes = atollv1.Verdict_VERDICT_NONE, 0 }))), "",
			"DEGRADED: 1 unit, 2 nodes; unit site-a: every agent cut from the hub, no peer protection; every node Ready; no unit partitioned", ExitDegraded},
		{"agents silent, then a kubelet dies", cluster(unit("site-a", "AgentsSilent",
			with(okNode("a1"), func(n *atollv1.NodeStatus) { n.Verdict, n.HealthyVotes = atollv1.Verdict_VERDICT_NONE, 0 }),
			&atollv1.NodeStatus{Name: "a2", Ready: "Unknown"})), "",
			"AT RISK: 1 unit, 2 nodes; node a2 lost by the cloud and not protected (no peer verdict); unit site-a: every agent cut from the hub, no peer protection; no unit partitioned", ExitAtRisk},
		{"many dead nodes", cluster(unit("site-a", "PartialDisruption", okNode("a0"), deadNode("a1"), deadNode("a2"), deadNode("a3"), deadNode("a4"), deadNode("a5"))), "",
			"AT RISK: 1 unit, 6 nodes; nodes a1, a2, a3 and 2 more unhealthy by their peers; no unit partitioned", ExitAtRisk},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := assess(tt.cs)
			if got := a.verdict(tt.unit, painter{}); got != tt.want {
				t.Errorf("verdict\n got %q\nwant %q", got, tt.want)
			}
			if got := a.safety.exitCode(); got != tt.code {
				t.Errorf("exit code %d, want %d", got, tt.code)
			}
			var out bytes.Buffer
			if err := printStatus(&out, tt.cs, tt.unit, "", painter{}); err != nil {
				t.Fatal(err)
			}
			if first, _, _ := strings.Cut(out.String(), "\n"); first != tt.want {
				t.Errorf("first line of the output %q, want the verdict", first)
			}
		})
	}
}

func TestRenderUnits(t *testing.T) {
	held := unit("site-b", "FullDisruption", cutNode("b1"), cutNode("b2"))
	held.HoldUntil = vts(9*time.Minute + 58*time.Second)
	cs := cluster(
		unit("site-a", "PartialDisruption", okNode("a1"), cutNode("a2"), deadNode("a3"), with(okNode("a4"), func(n *atollv1.NodeStatus) { n.ViewsBehind = "unit view" })),
		held,
		unit("site-c", "Normal", okNode("c1"), okNode("c2")),
		unit("site-d", "Normal", refusedNode("d1", "d2"), okNode("d2")),
	)
	want := `AT RISK: 4 units, 10 nodes; unit site-b partitioned (hold ends 10:09:58 UTC, in 9m58s); node a3 unhealthy by its peers; node a4 behind on its views; node d1's kubelet probe credentials refused by d2 (401 Unauthorized): fix --kubelet-token-file (get nodes/healthz); 1 node protected (cloud link lost, peers healthy)

UNIT    SAFETY    STATE              NODES  READY  PEERS-HEALTHY  PROTECTED  HOLD-UNTIL                       NOTES
site-a  AT RISK   PartialDisruption  4      2      3              1          -                                unhealthy by peers: a3; views behind: a4; protected: a2
site-b  AT RISK   FullDisruption     2      0      2              2          2026-05-01T10:09:58Z (in 9m58s)  partitioned
site-c  SAFE      Normal             2      2      2              0          -                                -
site-d  DEGRADED  Normal             2      2      2              0          -                                probe credentials refused: d1
`
	var out bytes.Buffer
	if err := printStatus(&out, cs, "", "", painter{}); err != nil {
		t.Fatal(err)
	}
	if out.String() != want {
		t.Fatalf("rendered:\n%s\nwant:\n%s", out.String(), want)
	}

	var empty bytes.Buffer
	if err := printStatus(&empty, cluster(), "", "", painter{}); err != nil || empty.String() != "no edge units: no node carries a unit label\n" {
		t.Fatalf("no units: %q, %v", empty.String(), err)
	}
}

var escape = regexp.MustCompile("\x1b\\[[0-9;]*m")

// TestColor: with colour on, the tables carry colour sequences and, once
// they are stripped, read exactly as without colour (the columns stay
// aligned); the levels and the peers' verdicts get their colours.
func TestColor(t *testing.T) {
	cs := cluster(unit("site-a", "PartialDisruption", okNode("a1"), cutNode("a2"), deadNode("a3")), unit("site-c", "Normal", okNode("c1"), okNode("c2")))
	for _, output := range []string{"", "wide"} {
		t.Run("-o "+output, func(t *testing.T) {
			var plain, colored bytes.Buffer
			if err := printStatus(&plain, cs, "", output, painter{}); err != nil {
				t.Fatal(err)
			}
			if err := printStatus(&colored, cs, "", output, painter{on: true}); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(plain.String(), "\x1b") {
				t.Fatalf("colour off, yet escapes:\n%q", plain.String())
			}
			if got := escape.ReplaceAllString(colored.String(), ""); got != plain.String() {
				t.Fatalf("coloured output, stripped:\n%s\nwithout colour:\n%s", got, plain.String())
			}
			for _, want := range []string{"\x1b[31mAT RISK\x1b[0m: 2 units"} {
				if !strings.Contains(colored.String(), want) {
					t.Errorf("no %q in\n%q", want, colored.String())
				}
			}
			wantCells := map[string][]string{
				"":     {"\x1b[32mSAFE\x1b[0m", "\x1b[31mAT RISK\x1b[0m  PartialDisruption"},
				"wide": {"\x1b[32mhealthy\x1b[0m", "\x1b[31munhealthy\x1b[0m", "\x1b[33mUnknown\x1b[0m", "\x1b[32mTrue\x1b[0m"},
			}[output]
			for _, want := range wantCells {
				if !strings.Contains(colored.String(), want) {
					t.Errorf("no %q in\n%q", want, colored.String())
				}
			}
		})
	}
}

func TestColorFlag(t *testing.T) {
	var buf bytes.Buffer
	t.Setenv("NO_COLOR", "")
	for _, tt := range []struct {
		flag, noColor string
		want          bool
	}{
		{"always", "", true}, {"always", "1", true}, {"never", "", false},
		{"auto", "", false}, // not a terminal
		{"auto", "1", false},
	} {
		t.Setenv("NO_COLOR", tt.noColor)
		if got := colorFlag(tt.flag).painter(&buf).on; got != tt.want {
			t.Errorf("--color=%s, NO_COLOR=%q: colour %v, want %v", tt.flag, tt.noColor, got, tt.want)
		}
	}
	var c colorFlag
	if err := c.Set("rainbow"); err == nil || err.Error() != "want auto, always or never" {
		t.Errorf("Set(rainbow) = %v", err)
	}
}
