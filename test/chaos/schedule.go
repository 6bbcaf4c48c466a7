package chaos

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Kind is a kind of fault.
type Kind string

// The faults a schedule mixes. Node and unit faults hit edge nodes; the
// others hit the cloud.
const (
	// NodeFlap cuts a node's link to the cloud (silently: packets
	// dropped) a few times for seconds each.
	NodeFlap Kind = "node-flap"
	// NodeCut cuts a node's link to the cloud for minutes: KCM loses it,
	// its peers still reach it.
	NodeCut Kind = "node-cut"
	// UnitCut cuts every node of a unit from the cloud for minutes
	// (shorter than the hold time).
	UnitCut Kind = "unit-cut"
	// UnitReboot cuts a unit from the cloud and powers every node of it
	// off and on while cut.
	UnitReboot Kind = "unit-reboot"
	// Degrade drops a share of a node's packets at random and limits its
	// uplink's rate.
	Degrade Kind = "degrade"
	// NodeDies powers a node off (kubelet, containerd, every container)
	// for minutes, then boots it.
	NodeDies Kind = "node-dies"
	// AgentKill kills a node's atoll-edge with SIGKILL (its kubelet
	// starts it again).
	AgentKill Kind = "agent-kill"
	// Relabel moves a node to another unit and, later, back.
	Relabel Kind = "relabel"
	// DiskFull fills a node's atoll-edge state disk (/var/lib/atoll:
	// its membership, the local API endpoint's cache, the pods'
	// addresses, the endpoints proxy's store) for minutes, then frees it.
	DiskFull Kind = "disk-full"
	// CloudKill kills an atoll-cloud replica with SIGKILL (its kubelet
	// starts it again; with the embedded hub, the hub goes with it).
	CloudKill Kind = "cloud-kill"
	// HubKill kills one of the hub's three servers with SIGKILL
	// (cluster shape only).
	HubKill Kind = "hub-kill"
	// KCMRestart and APIServerRestart kill kube-controller-manager or
	// kube-apiserver with SIGKILL and start it again.
	KCMRestart       Kind = "kcm-restart"
	APIServerRestart Kind = "apiserver-restart"
)

// Shapes of the hub.
const (
	ShapeEmbedded = "embedded"
	ShapeCluster  = "cluster"
)

// Fault is one entry of a schedule: Kind at At (from the schedule's
// start) for For, on Node or Unit.
type Fault struct {
	ID   int           `json:"id"`
	At   time.Duration `json:"at"`
	For  time.Duration `json:"for"`
	Kind Kind          `json:"kind"`
	Unit string        `json:"unit,omitempty"`
	Node string        `json:"node,omitempty"`
	// To is Relabel's destination unit.
	To string `json:"to,omitempty"`
	// Flaps is NodeFlap's number of cuts.
	Flaps int `json:"flaps,omitempty"`
	// Loss (percent) and Rate are Degrade's.
	Loss int    `json:"loss,omitempty"`
	Rate string `json:"rate,omitempty"`
}

// Target names what the fault hits.
func (f Fault) Target() string {
	switch {
	case f.Kind == Relabel:
		return f.Node + " → " + f.To
	case f.Node != "":
		return f.Node
	case f.Unit != "":
		return "unit " + f.Unit
	}
	return "cloud"
}

func (f Fault) String() string {
	s := fmt.Sprintf("#%-3d +%-8s %-17s %-18s for %s", f.ID, f.At.Round(time.Second), f.Kind, f.Target(), f.For.Round(time.Second))
	switch f.Kind {
	case NodeFlap:
		s += fmt.Sprintf(" (%d cuts)", f.Flaps)
	case Degrade:
		rate := f.Rate
		if rate == "" {
			rate = "no rate limit"
		}
		s += fmt.Sprintf(" (%d %% loss, %s)", f.Loss, rate)
	}
	return s
}

// Topology is what a schedule is made for.
type Topology struct {
	// Units are the edge nodes by unit.
	Units map[string][]string `json:"units"`
	// Shape is ShapeEmbedded or ShapeCluster.
	Shape string `json:"shape"`
}

// Schedule is a seeded fault schedule.
type Schedule struct {
	Seed     uint64        `json:"seed"`
	Duration time.Duration `json:"duration"`
	Topology Topology      `json:"topology"`
	Faults   []Fault       `json:"faults"`
}

func (s Schedule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, %s, hub %s, %d units, %d faults:\n", s.Seed, s.Duration, s.Topology.Shape, len(s.Topology.Units), len(s.Faults))
	for _, f := range s.Faults {
		b.WriteString("  " + f.String() + "\n")
	}
	return b.String()
}

// Counts is the number of faults by kind.
func (s Schedule) Counts() map[Kind]int {
	out := map[Kind]int{}
	for _, f := range s.Faults {
		out[f.Kind]++
	}
	return out
}

// Settle is how long a unit stays free of new faults after one ended, so
// that each fault's effects can be told apart: long enough for a dead
// node's pods to be replaced and a cut unit's hold to end.
const Settle = 90 * time.Second

// Lulls: nothing happens in the last Lull of every Cycle, nor in the last
// min(Lull, d/4) of a run, so that quiet is checked too (atoll-cloud
// writes nothing, memory stays flat).
const (
	Cycle = 20 * time.Minute
	Lull  = 5 * time.Minute
)

// inLull tells whether [from, to] meets a lull of a run of d.
func inLull(from, to, d time.Duration) bool {
	if to > d-min(Lull, d/4) {
		return true
	}
	for c := time.Duration(0); c < d; c += Cycle {
		if from < c+Cycle && to > c+Cycle-Lull {
			return true
		}
	}
	return false
}

// weights of the kinds (the cloud's faults are rarer: each hits every unit).
var weights = []struct {
	kind   Kind
	weight int
}{
	{NodeFlap, 4}, {NodeCut, 4}, {UnitCut, 3}, {UnitReboot, 2}, {Degrade, 3}, {NodeDies, 3},
	{AgentKill, 3}, {Relabel, 1}, {CloudKill, 2}, {HubKill, 2}, {KCMRestart, 1}, {APIServerRestart, 1},
	{DiskFull, 2},
}

// pick is the kind whose share of the weights holds n.
func pick(n int) Kind {
	for _, w := range weights {
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	return weights[len(weights)-1].kind
}

// MakeSchedule makes the schedule of seed for d on topo: the same seed, duration
// and topology give the same schedule. Faults come 10–40 s apart; a unit
// has one fault at a time (and Settle after it), the cloud one at a time,
// so each fault's effects can be told apart while cloud and unit faults
// overlap. Every fault ends before d, and none is in force in a lull.
func MakeSchedule(seed uint64, d time.Duration, topo Topology) Schedule {
	r := rand.New(rand.NewPCG(seed, 0x61746f6c6c)) //nolint:gosec // a reproducible schedule, not a secret
	units := slices.Sorted(maps.Keys(topo.Units))
	s := Schedule{Seed: seed, Duration: d, Topology: topo}
	busy := map[string]time.Duration{} // unit (or "" for the cloud): free again from
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(r.Int64N(int64(hi-lo)+1)).Round(time.Second)
	}
	total := 0
	for _, w := range weights {
		total += w.weight
	}
	for at := between(10*time.Second, 30*time.Second); at < d; at += between(10*time.Second, 40*time.Second) {
		kind := pick(r.IntN(total))
		f := Fault{ID: len(s.Faults) + 1, At: at, Kind: kind}
		switch kind {
		case NodeFlap:
			f.Flaps = 2 + r.IntN(4)
			f.For = between(30*time.Second, 90*time.Second)
		case NodeCut:
			f.For = between(60*time.Second, 180*time.Second)
		case UnitCut:
			f.For = between(60*time.Second, 240*time.Second)
		case UnitReboot:
			f.For = between(120*time.Second, 240*time.Second)
		case Degrade:
			f.Loss = 2 + r.IntN(9)
			f.Rate = []string{"", "1mbit", "4mbit"}[r.IntN(3)]
			f.For = between(60*time.Second, 180*time.Second)
		case NodeDies:
			// KCM's grace, the toleration and the eviction, and the
			// replacement's start before the node is back.
			f.For = between(150*time.Second, 240*time.Second)
		case AgentKill:
			f.For = 30 * time.Second
		case Relabel:
			f.For = between(120*time.Second, 240*time.Second)
		case DiskFull:
			f.For = between(60*time.Second, 240*time.Second)
		case HubKill:
			if topo.Shape != ShapeCluster {
				continue // the hub is atoll-cloud's: cloud-kill
			}
			f.For = 60 * time.Second
		case CloudKill, KCMRestart, APIServerRestart:
			f.For = 60 * time.Second
		}
		if at+f.For > d || inLull(at, at+f.For, d) {
			continue
		}
		cloud := kind == CloudKill || kind == HubKill || kind == KCMRestart || kind == APIServerRestart
		if cloud {
			if busy[""] > at {
				continue
			}
			busy[""] = at + f.For + Settle/3
			s.Faults = append(s.Faults, f)
			continue
		}
		var free []string
		for _, u := range units {
			if busy[u] <= at {
				free = append(free, u)
			}
		}
		if kind == Relabel {
			// Moving a node needs a second unit, free too, that keeps
			// the node's peers: both units of three or more.
			var big []string
			for _, u := range free {
				if len(topo.Units[u]) >= 3 {
					big = append(big, u)
				}
			}
			if len(big) < 2 {
				continue
			}
			i := r.IntN(len(big))
			f.Unit = big[i]
			big = slices.Delete(big, i, i+1)
			f.To = big[r.IntN(len(big))]
			busy[f.To] = at + f.For + Settle
		} else {
			if len(free) == 0 {
				continue
			}
			f.Unit = free[r.IntN(len(free))]
		}
		if kind != UnitCut && kind != UnitReboot {
			nodes := topo.Units[f.Unit]
			f.Node = nodes[r.IntN(len(nodes))]
		}
		busy[f.Unit] = at + f.For + Settle
		s.Faults = append(s.Faults, f)
	}
	for i := range s.Faults {
		s.Faults[i].ID = i + 1
	}
	return s
}
