package console

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/units"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Health is what the page reads from the health service
// (*health.Service implements it).
type Health interface {
	Tally(node string) health.Tally
	Votes(node string) []health.Vote
	UnitState(unit string) (health.UnitState, time.Time)
	Protected(node string) bool
	LinkDown(node string) bool
}

// Tunnels gathers the open tunnel sessions of every replica by node
// (*status.Responder implements it).
type Tunnels interface {
	GatherTunnels() (sessions map[string]uint32, replicas uint32, ok bool)
}

// Agents tells what each node's agent reports
// (*members.Service implements it): the refusals of its probe
// credentials by its peers, and which views it holds behind ("unknown"
// while it has not reported).
type Agents interface {
	ProbeRefusals(node string) []*atollv1.ProbeRefusal
	ViewsBehind(node string) string
}

// Keys tells whether the cloud holds a valid identity key for a node's
// agent (*identity.Service implements it).
type Keys interface {
	NodeKey(node string) (string, bool)
}

// Node states, the colour of a node's cell (data-state).
const (
	StateHealthy   = "healthy"   // the kubelet reports Ready, peers do not call it unhealthy
	StateProtected = "protected" // the cloud lost it, its peers say healthy: Atoll keeps it
	StateUnhealthy = "unhealthy" // peers say unhealthy, or Kubernetes sees it not ready and nobody protects it
	StateUnknown   = "unknown"   // no Ready condition yet
)

// State is the whole model: what GET /ui/api/state returns and the
// first SSE message carries.
type State struct {
	Time     time.Time       `json:"time"`
	Replica  string          `json:"replica,omitempty"`
	Units    []Unit          `json:"units"`
	Timeline []TimelineEntry `json:"timeline"`
	// TunnelReplicas is how many replicas answered the last gather of
	// tunnel sessions (-1: not gathered).
	TunnelReplicas int `json:"tunnelReplicas"`
}

// Unit is one edge unit (site).
type Unit struct {
	Name string `json:"name"`
	// Disruption is the health service's state of the unit: Normal,
	// PartialDisruption, FullDisruption or AgentsSilent.
	Disruption string     `json:"disruption"`
	HoldUntil  *time.Time `json:"holdUntil,omitempty"`
	Nodes      []Node     `json:"nodes"`
	Grids      []GridUnit `json:"grids,omitempty"`
}

// Node is one edge node.
type Node struct {
	Name string `json:"name"`
	// State is the cell's colour (StateHealthy, ...).
	State string `json:"state"`
	// Ready is the Node's Ready condition, as kube-controller-manager
	// and the kubelet left it: True, False, Unknown or "".
	Ready string `json:"ready"`
	// Verdict is the peers' verdict: healthy, unhealthy or none.
	Verdict   string `json:"verdict"`
	Protected bool   `json:"protected"`
	// Link is the agent's leaf link to the hub as the cloud saw it
	// last: "up", or "down" when the hub reported it closed after the
	// node's latest vote.
	Link  string `json:"link"`
	Votes []Vote `json:"votes,omitempty"`
	// Tunnels is the number of open tunnel sessions to the node, over
	// every replica.
	Tunnels uint32 `json:"tunnels,omitempty"`
	// ProbeRefusals are the peers refusing the probe credentials of the
	// node's agent (its kubelet token), the last per check plugin: a
	// configuration error; none while the token is accepted or the agent
	// sends none.
	ProbeRefusals []ProbeRefusal `json:"probeRefusals,omitempty"`
	// NoKey: the node's agent reports, but the cloud holds no valid
	// identity key for it, so its peers drop its probe reports.
	NoKey bool `json:"noKey,omitempty"`
}

// ProbeRefusal is a peer refusing the credentials of one of a node's
// check plugins.
type ProbeRefusal struct {
	Plugin string `json:"plugin"`
	Peer   string `json:"peer"`
	// Status is the HTTP status the peer answered ("401 Unauthorized").
	Status string `json:"status"`
}

// Vote is one peer's fresh vote about a node, which the verdict counts.
type Vote struct {
	Voter   string    `json:"voter"`
	Verdict string    `json:"verdict"`
	Made    time.Time `json:"made"`   // the voter's clock
	Stored  time.Time `json:"stored"` // the hub's clock
}

// GridUnit is a grid's child in one unit: its template revision against
// the revision the rollout brings.
type GridUnit struct {
	// Grid is kind/namespace/name (DeploymentGrid/ns/web).
	Grid string `json:"grid"`
	// Revision is the hash of the template the unit's child has.
	Revision string `json:"revision"`
	// Rollout is the revision of the grid's spec the current rollout
	// brings (a hash of the whole spec, not of one unit's template).
	Rollout string `json:"rollout,omitempty"`
	// Current: the unit's child has the template the rollout brings
	// (the unit is among the rollout's updated units, or no rollout is
	// recorded).
	Current bool `json:"current"`
	Ready   bool `json:"ready"`
	// ReadyReplicas of Replicas.
	ReadyReplicas int32 `json:"readyReplicas"`
	Replicas      int32 `json:"replicas"`
	// Phase is the unit's place in the rollout: updated, pending,
	// stalled, skipped, or "" with no rollout under way.
	Phase string `json:"phase,omitempty"`
	// Position is the unit's 1-based place in the rollout order
	// (updated units first, then pending ones), of Of.
	Position int `json:"position,omitempty"`
	Of       int `json:"of,omitempty"`
}

// TimelineEntry is one change the page saw (a verdict, a protection, a
// cell's colour, a unit's disruption state) or a protective write the
// health service made.
type TimelineEntry struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"`
	// Kind: verdict, protected, unprotected, state, disruption, write.
	Kind   string `json:"kind"`
	Unit   string `json:"unit"`
	Node   string `json:"node,omitempty"`
	From   string `json:"from"`
	To     string `json:"to"`
	Detail string `json:"detail,omitempty"`
}

// builder reads the model from memory: the manager's cache of Nodes and
// grids, the health service, the agents' reports and the last tunnel
// gather.
type builder struct {
	health Health
	nodes  corelisters.NodeLister
	grids  client.Reader // nil: no grid controllers
	agents Agents        // nil: no refusals shown
	keys   Keys          // nil: no node shown without a key
	rule   units.Rule
}

func verdictName(v atollv1.Verdict) string {
	switch v {
	case atollv1.Verdict_VERDICT_HEALTHY:
		return "healthy"
	case atollv1.Verdict_VERDICT_UNHEALTHY:
		return "unhealthy"
	default:
		return "none"
	}
}

// nodeState is a node's colour: protected wins; then the peers'
// unhealthy verdict; then Kubernetes' Ready condition.
func nodeState(ready corev1.ConditionStatus, verdict atollv1.Verdict, protected bool) string {
	switch {
	case protected:
		return StateProtected
	case verdict == atollv1.Verdict_VERDICT_UNHEALTHY:
		return StateUnhealthy
	case ready == corev1.ConditionTrue:
		return StateHealthy
	case ready == corev1.ConditionFalse || ready == corev1.ConditionUnknown:
		return StateUnhealthy
	default:
		return StateUnknown
	}
}

// units builds every unit, sorted by name with their nodes sorted;
// tunnels are the sessions by node.
func (b *builder) units(ctx context.Context, tunnels map[string]uint32) ([]Unit, error) {
	nodes, err := b.nodes.List(labels.Everything())
	if err != nil {
		return nil, fmt.Errorf("console: list nodes: %w", err)
	}
	byUnit := map[string][]*corev1.Node{}
	for _, n := range nodes {
		if u := b.rule.Of(n); u != "" {
			byUnit[u] = append(byUnit[u], n)
		}
	}
	grids := b.gridUnits(ctx)
	out := make([]Unit, 0, len(byUnit))
	for _, name := range slices.Sorted(maps.Keys(byUnit)) {
		members := byUnit[name]
		slices.SortFunc(members, func(a, b *corev1.Node) int { return cmp.Compare(a.Name, b.Name) })
		st, hold := b.health.UnitState(name)
		u := Unit{Name: name, Disruption: string(st), Nodes: make([]Node, 0, len(members)), Grids: grids[name]}
		if !hold.IsZero() {
			u.HoldUntil = &hold
		}
		for _, n := range members {
			u.Nodes = append(u.Nodes, b.node(n, tunnels[n.Name]))
		}
		out = append(out, u)
	}
	return out, nil
}

func (b *builder) node(n *corev1.Node, tunnels uint32) Node {
	j := b.health.Tally(n.Name)
	ready := readyCondition(n)
	prot := b.health.Protected(n.Name)
	out := Node{Name: n.Name, Ready: string(ready), Verdict: verdictName(j.Verdict), Protected: prot,
		State: nodeState(ready, j.Verdict, prot), Link: "up", Tunnels: tunnels}
	if b.health.LinkDown(n.Name) {
		out.Link = "down"
	}
	for _, v := range b.health.Votes(n.Name) {
		out.Votes = append(out.Votes, Vote{Voter: v.Voter, Verdict: verdictName(v.Verdict), Made: v.Made.UTC(), Stored: v.Stored.UTC()})
	}
	if b.agents != nil {
		for _, r := range b.agents.ProbeRefusals(n.Name) {
			out.ProbeRefusals = append(out.ProbeRefusals, ProbeRefusal{Plugin: r.GetPlugin(), Peer: r.GetPeer(), Status: r.GetStatus()})
		}
		if b.keys != nil && b.agents.ViewsBehind(n.Name) != "unknown" {
			_, ok := b.keys.NodeKey(n.Name)
			out.NoKey = !ok
		}
	}
	return out
}

// sameUnit reports whether a and b show the same (what the page would
// encode of them is equal).
func sameUnit(a, b Unit) bool {
	return a.Name == b.Name && a.Disruption == b.Disruption && sameTime(a.HoldUntil, b.HoldUntil) &&
		slices.EqualFunc(a.Nodes, b.Nodes, sameNode) && slices.Equal(a.Grids, b.Grids)
}

func sameNode(a, b Node) bool {
	return a.Name == b.Name && a.State == b.State && a.Ready == b.Ready && a.Verdict == b.Verdict &&
		a.Protected == b.Protected && a.Link == b.Link && a.Tunnels == b.Tunnels && a.NoKey == b.NoKey &&
		slices.Equal(a.ProbeRefusals, b.ProbeRefusals) &&
		slices.EqualFunc(a.Votes, b.Votes, func(x, y Vote) bool {
			return x.Voter == y.Voter && x.Verdict == y.Verdict && x.Made.Equal(y.Made) && x.Stored.Equal(y.Stored)
		})
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// readyCondition is n's Ready condition, "" when it has none.
func readyCondition(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// gridUnits reads the grids' status from the manager's cache, by unit.
func (b *builder) gridUnits(ctx context.Context) map[string][]GridUnit {
	out := map[string][]GridUnit{}
	if b.grids == nil {
		return out
	}
	var dgs appsv1alpha1.DeploymentGridList
	if err := b.grids.List(ctx, &dgs); err == nil {
		for i := range dgs.Items {
			g := &dgs.Items[i]
			addGrid(out, "DeploymentGrid/"+g.Namespace+"/"+g.Name, &g.Status)
		}
	}
	var sgs appsv1alpha1.StatefulSetGridList
	if err := b.grids.List(ctx, &sgs); err == nil {
		for i := range sgs.Items {
			g := &sgs.Items[i]
			addGrid(out, "StatefulSetGrid/"+g.Namespace+"/"+g.Name, &g.Status)
		}
	}
	for u := range out {
		slices.SortFunc(out[u], func(a, b GridUnit) int { return cmp.Compare(a.Grid, b.Grid) })
	}
	return out
}

// addGrid adds one grid's units. The rollout's order is its updated
// units, then its pending ones.
func addGrid(out map[string][]GridUnit, name string, st *appsv1alpha1.GridStatus) {
	phase, pos := map[string]string{}, map[string]int{}
	of := 0
	rollout := ""
	if r := st.Rollout; r != nil {
		rollout = r.Revision
		for _, u := range r.Updated {
			of++
			phase[u], pos[u] = "updated", of
		}
		for _, u := range r.Pending {
			of++
			phase[u], pos[u] = "pending", of
		}
		for _, u := range r.Skipped {
			phase[u] = "skipped"
		}
		for _, u := range r.Stalled {
			phase[u] = "stalled"
		}
	}
	for _, us := range st.Units {
		gu := GridUnit{Grid: name, Revision: us.Revision, Rollout: rollout, Ready: us.Ready,
			ReadyReplicas: us.ReadyReplicas, Replicas: us.Replicas, Phase: phase[us.Name], Position: pos[us.Name]}
		gu.Current = st.Rollout == nil || gu.Phase == "updated"
		if gu.Position > 0 {
			gu.Of = of
		}
		out[us.Name] = append(out[us.Name], gu)
	}
}
