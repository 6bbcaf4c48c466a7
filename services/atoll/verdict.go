package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Safety is how safe `atoll status` judges a unit or the whole selection,
// from what the ClusterStatus carries. The levels are ordered: a
// selection is as unsafe as its least safe unit, a unit as its least safe
// node.
type Safety int

const (
	// Safe: no unit partitioned, and every node is either Ready by the
	// cloud or protected by Atoll (lost by the cloud, kept because its
	// peers see it healthy); a Ready node with peers has their healthy
	// verdict and its agent holds the current views.
	Safe Safety = iota
	// Degraded: nothing is being evicted, but a safety net is thin: a
	// Ready node without a peer verdict in a unit of two or more whose
	// nodes are all Ready (if its cloud link drops, nothing protects it;
	// while a peer is lost, the verdicts lacking that peer's votes are
	// expected and not counted), a unit whose every agent is cut from the
	// hub while its kubelets report (AgentsSilent), a Ready node its peers
	// judge unhealthy (they cannot reach it), an agent behind on the
	// views the cloud published, or an agent whose kubelet token a Ready
	// peer refuses (a configuration error: its checks count the peer up
	// without seeing its health).
	Degraded
	// AtRisk: Kubernetes evicts or will evict pods: a unit partitioned
	// (FullDisruption: held until its hold ends, then released to
	// Kubernetes), or a node lost by the cloud that Atoll does not
	// protect (its peers judge it unhealthy, or give no verdict).
	AtRisk
)

func (s Safety) String() string {
	switch s {
	case Safe:
		return "SAFE"
	case Degraded:
		return "DEGRADED"
	default:
		return "AT RISK"
	}
}

// Exit codes of `atoll status --exit-code` (besides cliflags' 1 and 2).
const (
	ExitDegraded = 3
	ExitAtRisk   = 4
)

// exitCode is the --exit-code process exit code of s (0 for Safe).
func (s Safety) exitCode() int {
	switch s {
	case Degraded:
		return ExitDegraded
	case AtRisk:
		return ExitAtRisk
	}
	return 0
}

// finding is one kind of thing `atoll status` reports about nodes or
// units.
type finding struct {
	safety Safety
	// one and many phrase it for one and for several names ("%s" is
	// the names); short is its label in the per-unit table's NOTES.
	one, many, short string
}

// The findings, in the order the verdict names them.
var (
	fPartitioned = finding{AtRisk, "unit %s", "units %s", "partitioned"} // names say "partitioned"
	fDead        = finding{AtRisk, "node %s unhealthy by its peers", "nodes %s unhealthy by their peers", "unhealthy by peers"}
	fExposed     = finding{AtRisk, "node %s lost by the cloud and not protected (no peer verdict)", "nodes %s lost by the cloud and not protected (no peer verdict)", "lost, not protected"}
	fNotReady    = finding{AtRisk, "node %s not ready by its own kubelet: left to Kubernetes", "nodes %s not ready by their own kubelets: left to Kubernetes", "not ready"}
	fDisputed    = finding{Degraded, "node %s Ready but unhealthy by its peers", "nodes %s Ready but unhealthy by their peers", "Ready, unhealthy by peers"}
	fUnwatched   = finding{Degraded, "node %s has no peer verdict", "nodes %s have no peer verdict", "no peer verdict"}
	fSilent      = finding{Degraded, "unit %s: every agent cut from the hub, no peer protection", "units %s: every agent cut from the hub, no peer protection", "agents silent"}
	fBehind      = finding{Degraded, "node %s behind on its views", "nodes %s behind on their views", "views behind"}
	fRefused     = finding{Degraded, "node %s's kubelet probe credentials refused by %s: " + fixToken, "kubelet probe credentials of nodes %s refused by their peers: " + fixToken, "probe credentials refused"} // one also names the peer and status
	fNoKey       = finding{Degraded, "node %s has no key recorded by the cloud: its peers drop its reports", "nodes %s have no key recorded by the cloud: their peers drop their reports", "no key"}
	fProtected   = finding{Safe, "1 node protected (cloud link lost, peers healthy)", "%d nodes protected (cloud link lost, peers healthy)", "protected"}
	findings     = []*finding{&fPartitioned, &fDead, &fExposed, &fNotReady, &fDisputed, &fSilent, &fUnwatched, &fBehind, &fRefused, &fNoKey, &fProtected}
)

// fixToken is what to do about refused probe credentials.
const fixToken = "fix --kubelet-token-file (get nodes/healthz)"

// maxNames is how many names a verdict or a note spells out per finding.
const maxNames = 3

// assessment is the safety of a unit or a selection, with what it found.
type assessment struct {
	safety       Safety
	units, nodes int
	partitioned  int
	found        map[*finding][]string // names, in status order
	refusedBy    map[string]string     // fRefused's nodes: "<peer> (<status>)"
}

func (a *assessment) add(f *finding, name string) {
	if a.found == nil {
		a.found = map[*finding][]string{}
	}
	a.found[f] = append(a.found[f], name)
	a.safety = max(a.safety, f.safety)
}

// assessUnit judges one unit; at is the status's time.
func assessUnit(u *atollv1.UnitStatus, at time.Time) *assessment {
	a := &assessment{units: 1, nodes: len(u.GetNodes())}
	if u.GetState() == "FullDisruption" {
		// The unit's finding covers its nodes: all lost, held together.
		a.partitioned = 1
		a.add(&fPartitioned, u.GetUnit()+" partitioned"+holdNote(u, at))
		return a
	}
	// Every agent of the unit cut from the hub while its kubelets report:
	// no verdict reaches the cloud, which is this finding, not one per
	// node; a node lost meanwhile is not protected (at risk, below).
	silent := u.GetState() == "AgentsSilent"
	if silent {
		a.add(&fSilent, u.GetUnit())
	}
	// While a node is lost, its votes about its peers do not reach the
	// cloud either, so their verdicts may lack a majority: expected, not
	// a fault of their own.
	lost := slices.ContainsFunc(u.GetNodes(), func(n *atollv1.NodeStatus) bool { return n.GetReady() != "True" })
	for _, n := range u.GetNodes() {
		ready := n.GetReady() == "True"
		switch {
		case !ready && n.GetProtected():
			a.add(&fProtected, n.GetName())
			continue // its views are expected to lag while it is cut
		case !ready && n.GetVerdict() == atollv1.Verdict_VERDICT_UNHEALTHY:
			a.add(&fDead, n.GetName())
		case n.GetReady() == "False":
			// The kubelet reports it (a runtime down, a full disk):
			// Atoll never protects such a node.
			a.add(&fNotReady, n.GetName())
		case !ready:
			a.add(&fExposed, n.GetName())
		case n.GetVerdict() == atollv1.Verdict_VERDICT_UNHEALTHY:
			a.add(&fDisputed, n.GetName())
		case n.GetVerdict() != atollv1.Verdict_VERDICT_HEALTHY && len(u.GetNodes()) > 1 && !lost && !silent:
			a.add(&fUnwatched, n.GetName())
		}
		if b := n.GetViewsBehind(); b != "" && b != "unknown" {
			a.add(&fBehind, n.GetName())
		}
		if r := tokenRefusal(n, u); r != nil {
			a.add(&fRefused, n.GetName())
			a.refusedAt(n.GetName(), r.GetPeer()+" ("+r.GetStatus()+")")
		}
		if n.GetNoKey() {
			a.add(&fNoKey, n.GetName())
		}
	}
	return a
}

// tokenRefusal is the first refusal of n's probe credentials by a peer
// the cloud sees Ready, nil when there is none. A peer the cloud has lost
// refuses any token (its kubelet cannot ask the apiserver to verify it),
// which is no fault of the token.
func tokenRefusal(n *atollv1.NodeStatus, u *atollv1.UnitStatus) *atollv1.ProbeRefusal {
	for _, r := range n.GetProbeRefusals() {
		i := slices.IndexFunc(u.GetNodes(), func(p *atollv1.NodeStatus) bool { return p.GetName() == r.GetPeer() })
		if i < 0 || u.GetNodes()[i].GetReady() == "True" {
			return r
		}
	}
	return nil
}

// refusedAt records by whom node's probe credentials are refused.
func (a *assessment) refusedAt(node, by string) {
	if a.refusedBy == nil {
		a.refusedBy = map[string]string{}
	}
	a.refusedBy[node] = by
}

// holdNote says when a partitioned unit's hold ends or ended.
func holdNote(u *atollv1.UnitStatus, at time.Time) string {
	if u.GetHoldUntil() == nil {
		return " (not held)"
	}
	end := u.GetHoldUntil().AsTime()
	clock := end.UTC().Format("15:04:05") + " UTC"
	if left := end.Sub(at); left > 0 {
		return fmt.Sprintf(" (hold ends %s, in %v)", clock, left.Round(time.Second))
	}
	return fmt.Sprintf(" (hold ended %s: released to Kubernetes)", clock)
}

// assess judges the whole selection.
func assess(cs *atollv1.ClusterStatus) *assessment {
	at := cs.GetTime().AsTime()
	all := &assessment{}
	for _, u := range cs.GetUnits() {
		a := assessUnit(u, at)
		all.units++
		all.nodes += a.nodes
		all.partitioned += a.partitioned
		all.safety = max(all.safety, a.safety)
		for f, names := range a.found {
			for _, n := range names {
				all.add(f, n)
			}
		}
		for n, by := range a.refusedBy {
			all.refusedAt(n, by)
		}
	}
	return all
}

// names spells out at most maxNames names, then how many more.
func names(ns []string) string {
	if len(ns) <= maxNames {
		return strings.Join(ns, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ns[:maxNames], ", "), len(ns)-maxNames)
}

// phrase is finding f for the names a found it in.
func (a *assessment) phrase(f *finding) string {
	ns := a.found[f]
	switch {
	case f == &fProtected && len(ns) == 1:
		return f.one
	case f == &fProtected:
		return fmt.Sprintf(f.many, len(ns))
	case f == &fRefused && len(ns) == 1:
		return fmt.Sprintf(f.one, ns[0], a.refusedBy[ns[0]])
	case len(ns) == 1:
		return fmt.Sprintf(f.one, ns[0])
	}
	return fmt.Sprintf(f.many, names(ns))
}

// verdict is the one-sentence answer to "is my site safe?" for the
// selection: the level, its size (unit is the --unit asked for, if any),
// then what it found, worst first.
func (a *assessment) verdict(unit string, p painter) string {
	var parts []string
	switch {
	case unit != "":
		parts = append(parts, fmt.Sprintf("unit %s, %s", unit, plural(a.nodes, "node")))
	default:
		parts = append(parts, fmt.Sprintf("%s, %s", plural(a.units, "unit"), plural(a.nodes, "node")))
	}
	for _, f := range findings {
		if len(a.found[f]) > 0 {
			parts = append(parts, a.phrase(f))
		}
	}
	if len(a.found[&fProtected])+len(a.found[&fDead])+len(a.found[&fExposed])+len(a.found[&fNotReady])+a.partitioned == 0 {
		parts = append(parts, "every node Ready")
	}
	if a.partitioned == 0 {
		parts = append(parts, "no unit partitioned")
	}
	return p.paint(safetyColor(a.safety), a.safety.String()) + ": " + strings.Join(parts, "; ")
}

// notes is the per-unit table's NOTES cell: each finding's short label
// and the nodes it names ("-" for none).
func (a *assessment) notes() string {
	var parts []string
	for _, f := range findings {
		ns := a.found[f]
		switch {
		case len(ns) == 0:
		case f == &fPartitioned:
			parts = append(parts, f.short)
		default:
			parts = append(parts, f.short+": "+names(ns))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func safetyColor(s Safety) color {
	switch s {
	case Safe:
		return green
	case Degraded:
		return yellow
	default:
		return red
	}
}
