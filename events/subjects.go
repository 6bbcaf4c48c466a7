package events

import (
	"fmt"
	"strings"
	"unicode"
)

// Subjects. Every subject Atoll publishes on is built and parsed by a
// Family of the catalog (catalog.go); nothing else in the repository formats
// subjects by hand. Subjects are part of the public interface (operators run
// `nats sub 'atoll.health.>'`), so their layout is stable. `atoll events
// catalog` prints the table.
const (
	// Root is the first token of every Atoll subject.
	Root = "atoll"

	// ClusterScoped is the namespace token of views of cluster-scoped
	// objects (Nodes, the unit membership, host records).
	ClusterScoped = "_"

	// NoUnit is the unit token of views addressed to one node rather than
	// a unit. It is not a valid Kubernetes label value, so no unit has it.
	NoUnit = "_"

	// SharedSpace is the unit token of the shared view space, the views
	// every unit reads (cloud/views/objects): Services, EndpointSlices and
	// Endpoints (the last two with their endpoints' nodes' values of the
	// Service's topology keys), stored once rather than once per unit. A unit name comes from a Kubernetes label
	// value, which cannot start with '_', so no unit has it; ValidUnit
	// refuses it all the same.
	SharedSpace = "_all"

	// HubCluster is the NATS cluster name of the hub's servers. No unit
	// may take it: a unit's servers form a cluster named after the unit,
	// and a leaf's cluster name must differ from its hub's.
	HubCluster = "atoll-hub"

	// View kinds that are not Kubernetes resources.
	KindUnit       = "unit"
	KindHosts      = "hosts"
	KindAssignment = "assignment"
)

// Wildcard subjects for subscriptions and stream definitions.
const (
	AllSubjects    = Root + ".>"
	HealthSubjects = Root + ".health.>"
	ProbeSubjects  = Root + ".health.probe.>"
	BallotSubjects = Root + ".health.ballot.>"
	TopoSubjects   = Root + ".topo.>"
	// NodeTopologySubjects are the nodes' reports (TopologyFamily), and
	// UnitEventSubjects the unit lifecycle events (UnitEventFamily), both
	// in the TOPOLOGY stream.
	NodeTopologySubjects = Root + ".topo.node.*"
	UnitEventSubjects    = Root + ".topo.unit.*"
	ViewSubjects         = Root + ".view.>"
	// ViewRepublishSubjects is where the hub republishes every view the
	// VIEWS stream stores (its RePublish): atoll.view.<rest> becomes
	// atoll.viewpub.<rest>, with the stream sequence and the subject's
	// previous sequence in headers. Edge agents follow their views there
	// with core subscriptions (edge/viewfeed) rather than a consumer each.
	// Its own second token, so no stream subject (atoll.view.>) covers
	// it: a republish into the stream's own subjects would loop.
	ViewRepublishSubjects = Root + "." + viewRepublishToken + ".>"
	TunnelSubjects        = Root + ".tunnel.>"
	// UnitRelaySubjects: the unit legs of relayed tunnel sessions
	// (UnitRelayFamily), only ever on a unit's routes.
	UnitRelaySubjects = Root + ".relay.>"
)

// StatusSubject is where operators (`atoll status`) ask the cloud for the
// health state of the edge units: a StatusRequest, answered with a
// ClusterStatus by one atoll-cloud replica, the "status" endpoint of the
// micro service CloudService. It is core NATS request/reply: no stream
// stores it.
const StatusSubject = Root + ".cloud.status"

// TunnelsSubject is where the replica answering a status request asks
// every atoll-cloud replica for its tunnel sessions: a
// TunnelSessionsRequest, answered with a TunnelSessions by each replica
// (the "tunnels" endpoint of CloudService, without a queue group).
const TunnelsSubject = Root + ".cloud.tunnels"

// TunnelDir is the direction token of a tunnel subject.
type TunnelDir string

const (
	// ToEdge carries frames from the cloud tunnel server to the edge agent.
	ToEdge TunnelDir = "in"
	// ToCloud carries frames from the edge agent to the cloud tunnel server.
	ToCloud TunnelDir = "out"
)

// Names and tokens. The catalog's builders take names (node names, unit
// names, sessions) and parsers return names. A Kubernetes node name is a
// DNS subdomain and often holds dots ("ip-10-0-1-2.ec2.internal"), which
// would split a subject token, so a name's dots travel as '~' in its token:
// '~' is allowed in NATS subjects and can appear in neither node names nor
// label values, so the mapping is exact both ways. Everything else that
// could change a subject's meaning ('*', '>', whitespace) is rejected.

// Token is the subject token of a name: its dots become '~'.
func Token(name string) string { return strings.ReplaceAll(name, ".", "~") }

// Name is the name a subject token stands for: its '~' become dots.
func Name(token string) string { return strings.ReplaceAll(token, "~", ".") }

// ValidName reports why s cannot name a unit, node or session in a
// subject: it is empty, or holds '*', '>', '~', whitespace or a control
// character.
func ValidName(s string) error {
	if s == "" {
		return ErrEmptyToken
	}
	for _, r := range s {
		switch {
		case r == '*', r == '>', r == '~':
			return fmt.Errorf("%w: %q contains %q", ErrInvalidToken, s, r)
		case unicode.IsSpace(r), unicode.IsControl(r):
			return fmt.Errorf("%w: %q contains whitespace or a control character", ErrInvalidToken, s)
		}
	}
	return nil
}

// ValidUnit reports why unit cannot name a unit: it is no valid name, or
// it is reserved (NoUnit, SharedSpace, HubCluster). SharedSpace is
// refused explicitly: a unit of that name would read, and be sent, the
// views shared by every unit as its own.
func ValidUnit(unit string) error {
	if err := ValidName(unit); err != nil {
		return err
	}
	if unit == NoUnit || unit == SharedSpace || unit == HubCluster {
		return fmt.Errorf("%w: unit name %q is reserved", ErrInvalidToken, unit)
	}
	return nil
}

// ValidToken reports why s cannot be one subject token, or nil if it can. A
// token is non-empty and holds no '.', '*', '>' or whitespace: any of those
// would let a node name or unit name change the meaning of a subject.
func ValidToken(s string) error {
	if s == "" {
		return ErrEmptyToken
	}
	for _, r := range s {
		switch {
		case r == '.', r == '*', r == '>':
			return fmt.Errorf("%w: %q contains %q", ErrInvalidToken, s, r)
		case unicode.IsSpace(r), unicode.IsControl(r):
			return fmt.Errorf("%w: %q contains whitespace or a control character", ErrInvalidToken, s)
		}
	}
	return nil
}

// ProbeSubject is where checker publishes its probe reports for unit.
func ProbeSubject(unit, checker string) (string, error) { return ProbeFamily.Subject(unit, checker) }

// ProbeUnitSubjects matches every probe report of unit.
func ProbeUnitSubjects(unit string) (string, error) {
	if unit == "" {
		return "", emptyName("unit")
	}
	if err := ValidName(unit); err != nil {
		return "", fmt.Errorf("probe subjects: unit: %w", err)
	}
	return strings.TrimSuffix(ProbeFamily.Wildcard(), "*.*") + Token(unit) + ".*", nil
}

// ParseProbeSubject returns the unit and checker of a probe subject.
func ParseProbeSubject(subject string) (unit, checker string, err error) {
	t, err := ProbeFamily.Parse(subject)
	if err != nil {
		return "", "", err
	}
	return t[0], t[1], nil
}

// BallotSubject is where voter publishes its ballot on the members of unit.
func BallotSubject(unit, voter string) (string, error) { return BallotFamily.Subject(unit, voter) }

// ParseBallotSubject returns the unit and voter of a ballot subject.
func ParseBallotSubject(subject string) (unit, voter string, err error) {
	t, err := BallotFamily.Parse(subject)
	if err != nil {
		return "", "", err
	}
	return t[0], t[1], nil
}

// TopologySubject is where node's edge agent reports itself.
func TopologySubject(node string) (string, error) { return TopologyFamily.Subject(node) }

// ParseTopologySubject returns the node of a topology subject.
func ParseTopologySubject(subject string) (node string, err error) {
	t, err := TopologyFamily.Parse(subject)
	if err != nil {
		return "", err
	}
	return t[0], nil
}

// UnitEventSubject is where the cloud publishes unit's lifecycle events.
func UnitEventSubject(unit string) (string, error) { return UnitEventFamily.Subject(unit) }

// ParseUnitEventSubject returns the unit of a unit event subject.
func ParseUnitEventSubject(subject string) (unit string, err error) {
	t, err := UnitEventFamily.Parse(subject)
	if err != nil {
		return "", err
	}
	return t[0], nil
}

// ViewSubject is where the cloud publishes its view of one object for unit.
// Use ClusterScoped as namespace for cluster-scoped objects.
func ViewSubject(unit, kind, namespace, name string) (string, error) {
	return ObjectViewFamily.Subject(unit, kind, namespace, name)
}

// UnitViewSubject is where the cloud publishes unit's membership.
func UnitViewSubject(unit string) (string, error) { return UnitViewFamily.Subject(unit) }

// HostsSubject is where the cloud publishes the host records of unit.
func HostsSubject(unit string) (string, error) { return HostsFamily.Subject(unit) }

// AssignmentSubject is where the cloud tells node which unit it is in.
func AssignmentSubject(node string) (string, error) { return AssignmentFamily.Subject(node) }

// UnitViewSubjects matches every view published for unit.
func UnitViewSubjects(unit string) (string, error) {
	if unit == "" {
		return "", emptyName("unit")
	}
	if err := ValidName(unit); err != nil {
		return "", fmt.Errorf("view subjects: unit: %w", err)
	}
	return strings.TrimSuffix(ViewSubjects, ">") + Token(unit) + ".>", nil
}

// SharedSpaceSubjects matches every view of the shared space
// (atoll.view._all.>).
func SharedSpaceSubjects() string {
	return strings.TrimSuffix(ViewSubjects, ">") + Token(SharedSpace) + ".>"
}

// viewRepublishToken is the second token of the republished views.
const viewRepublishToken = "viewpub"

// Republished is the subject (or filter) on which the hub republishes the
// views of subject, a view subject or filter (atoll.view.<rest>):
// atoll.viewpub.<rest>.
func Republished(subject string) (string, error) {
	rest, ok := strings.CutPrefix(subject, strings.TrimSuffix(ViewSubjects, ">"))
	if !ok || rest == "" {
		return "", fmt.Errorf("%w: %q is no view subject", ErrWrongSubject, subject)
	}
	return strings.TrimSuffix(ViewRepublishSubjects, ">") + rest, nil
}

// viewRelayToken is the second token of the views relayed inside a unit.
const viewRelayToken = "viewrelay"

// RelayedViewSubjects matches every view relayed inside unit
// (atoll.viewrelay.<unit>.>).
func RelayedViewSubjects(unit string) (string, error) {
	if err := ValidUnit(unit); err != nil {
		return "", err
	}
	return Root + "." + viewRelayToken + "." + unit + ".>", nil
}

// RelayedView is the subject on which an agent of unit relays the shared
// view stored on subject (atoll.view._all.<kind>.<namespace>.<name>):
// atoll.viewrelay.<unit>.<kind>.<namespace>.<name>.
func RelayedView(unit, subject string) (string, error) {
	if err := ValidUnit(unit); err != nil {
		return "", err
	}
	k, err := ParseViewSubject(subject)
	if err != nil {
		return "", err
	}
	if k.Unit != SharedSpace {
		return "", fmt.Errorf("%w: %q is not in the shared space", ErrWrongSubject, subject)
	}
	return Root + "." + viewRelayToken + "." + unit + "." + strings.TrimPrefix(subject, sharedPrefix), nil
}

// RelayResetSubject is where node, an agent of unit, tells the unit's
// relayed feeds that views it was given to relay may be lost
// (RelayResetFamily).
func RelayResetSubject(unit, node string) (string, error) {
	if err := ValidUnit(unit); err != nil {
		return "", err
	}
	return RelayResetFamily.Subject(unit, node)
}

// ViewRelayQueue is the queue group in which the agents of unit take the
// shared views the hub republishes (atoll.viewpub._all.>): the hub sends
// each to one agent of the unit, which relays it on the unit's routes
// (RelayedView). The edge permissions allow this group only.
func ViewRelayQueue(unit string) string { return unit }

// sharedPrefix starts every subject of the shared space.
var sharedPrefix = strings.TrimSuffix(SharedSpaceSubjects(), ">")

// ParseRelayedView returns the unit and the shared view's subject of a
// relayed view's subject.
func ParseRelayedView(subject string) (unit, view string, err error) {
	if _, err := RelayedViewFamily.Parse(subject); err != nil {
		return "", "", err
	}
	parts := strings.SplitN(subject, ".", 4)
	return parts[2], sharedPrefix + parts[3], nil
}

// ViewKey identifies one view.
type ViewKey struct {
	Unit, Kind, Namespace, Name string
}

// ParseViewSubject returns the parts of a view subject (of any view family).
func ParseViewSubject(subject string) (ViewKey, error) {
	t, err := ObjectViewFamily.Parse(subject)
	if err != nil {
		return ViewKey{}, err
	}
	return ViewKey{Unit: t[0], Kind: t[1], Namespace: t[2], Name: t[3]}, nil
}

// TunnelSubject carries the frames of session for node in direction dir.
func TunnelSubject(node, session string, dir TunnelDir) (string, error) {
	return TunnelFamily.Subject(node, session, string(dir))
}

// ParseTunnelSubject returns the node, session and direction of a tunnel subject.
func ParseTunnelSubject(subject string) (node, session string, dir TunnelDir, err error) {
	t, err := TunnelFamily.Parse(subject)
	if err != nil {
		return "", "", "", err
	}
	return t[0], t[1], TunnelDir(t[2]), nil
}

// APIServerDialSubject is where node asks for a connection to
// kube-apiserver (APIServerDialFamily).
func APIServerDialSubject(node string) (string, error) {
	return APIServerDialFamily.Subject(node)
}

// ParseAPIServerDialSubject returns the node of an apiserver dial subject.
func ParseAPIServerDialSubject(subject string) (node string, err error) {
	t, err := APIServerDialFamily.Parse(subject)
	if err != nil {
		return "", err
	}
	return t[0], nil
}

// TunnelRelaySubject carries, between the cloud and the relaying peer,
// the frames of node's session relayed through peer, in direction dir.
func TunnelRelaySubject(peer, node, session string, dir TunnelDir) (string, error) {
	return TunnelRelayFamily.Subject(peer, node, session, string(dir))
}

// ParseTunnelRelaySubject returns the relaying peer, node, session and
// direction of a tunnel relay subject.
func ParseTunnelRelaySubject(subject string) (peer, node, session string, dir TunnelDir, err error) {
	t, err := TunnelRelayFamily.Parse(subject)
	if err != nil {
		return "", "", "", "", err
	}
	return t[0], t[1], t[2], TunnelDir(t[3]), nil
}

// UnitRelaySubject carries, inside unit, between the relaying peer and
// node, the frames of node's session relayed through peer.
func UnitRelaySubject(unit, peer, node, session string, dir TunnelDir) (string, error) {
	return UnitRelayFamily.Subject(unit, peer, node, session, string(dir))
}

// ParseUnitRelaySubject returns the unit, relaying peer, node, session and
// direction of a unit relay subject.
func ParseUnitRelaySubject(subject string) (unit, peer, node, session string, dir TunnelDir, err error) {
	t, err := UnitRelayFamily.Parse(subject)
	if err != nil {
		return "", "", "", "", "", err
	}
	return t[0], t[1], t[2], t[3], TunnelDir(t[4]), nil
}
