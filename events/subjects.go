package events

import (
	"fmt"
	"strings"
	"unicode"
)

// Subject catalog. Every subject Atoll publishes on is built and parsed here;
// nothing else in the repository formats subjects by hand. Subjects are part
// of the public interface (operators run `nats sub 'atoll.health.>'`), so the
// layout below is stable.
//
//	atoll.health.probe.<unit>.<checker>          ProbeReport
//	atoll.health.vote.<unit>.<node>.<voter>      Vote
//	atoll.topo.node.<node>                       TopologyUpdate
//	atoll.view.<unit>.<kind>.<namespace>.<name>  UnitView, ObjectView, HostRecords
//	atoll.view._.assignment._.<node>             NodeAssignment
//	atoll.tunnel.<node>.<session>.<dir>          TunnelFrame
//	atoll.cloud.status                           StatusRequest → ClusterStatus (request/reply)
const (
	// Root is the first token of every Atoll subject.
	Root = "atoll"

	// ClusterScoped is the namespace token of views of cluster-scoped
	// objects (Nodes, the unit membership, host records).
	ClusterScoped = "_"

	// NoUnit is the unit token of views addressed to one node rather than
	// a unit. It is not a valid Kubernetes label value, so no unit has it.
	NoUnit = "_"

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
	VoteSubjects   = Root + ".health.vote.>"
	TopoSubjects   = Root + ".topo.>"
	ViewSubjects   = Root + ".view.>"
	TunnelSubjects = Root + ".tunnel.>"
)

// StatusSubject is where operators (`atoll status`) ask the cloud for the
// health state of the edge units: a StatusRequest, answered with a
// ClusterStatus by one atoll-cloud replica (queue group atoll-cloud). It
// is core NATS request/reply: no stream stores it.
const StatusSubject = Root + ".cloud.status"

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

// build validates values (names) and joins their tokens after prefix;
// names label the values in errors.
func build(prefix string, names []string, values ...string) (string, error) {
	tokens := make([]string, len(values))
	for i, v := range values {
		if err := ValidName(v); err != nil {
			return "", fmt.Errorf("subject %s: %s: %w", prefix, names[i], err)
		}
		tokens[i] = Token(v)
	}
	return prefix + "." + strings.Join(tokens, "."), nil
}

// parse splits subject after prefix into exactly len(names) valid tokens
// and returns the names they stand for.
func parse(subject, prefix string, names []string) ([]string, error) {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	if !ok {
		return nil, fmt.Errorf("%w: %q is not under %s", ErrWrongSubject, subject, prefix)
	}
	tokens := strings.Split(rest, ".")
	if len(tokens) != len(names) {
		return nil, fmt.Errorf("%w: %q: want %s.<%s>", ErrWrongSubject, subject, prefix, strings.Join(names, ">.<"))
	}
	for i, t := range tokens {
		if err := ValidToken(t); err != nil {
			return nil, fmt.Errorf("subject %q: %s: %w", subject, names[i], err)
		}
		tokens[i] = Name(t)
	}
	return tokens, nil
}

const (
	probePrefix  = Root + ".health.probe"
	votePrefix   = Root + ".health.vote"
	topoPrefix   = Root + ".topo.node"
	viewPrefix   = Root + ".view"
	tunnelPrefix = Root + ".tunnel"
)

var (
	probeNames  = []string{"unit", "checker"}
	voteNames   = []string{"unit", "node", "voter"}
	topoNames   = []string{"node"}
	viewNames   = []string{"unit", "kind", "namespace", "name"}
	tunnelNames = []string{"node", "session", "dir"}
)

// ProbeSubject is where checker publishes its probe reports for unit.
func ProbeSubject(unit, checker string) (string, error) {
	return build(probePrefix, probeNames, unit, checker)
}

// ProbeUnitSubjects matches every probe report of unit.
func ProbeUnitSubjects(unit string) (string, error) {
	if err := ValidName(unit); err != nil {
		return "", fmt.Errorf("probe subjects: unit: %w", err)
	}
	return probePrefix + "." + Token(unit) + ".*", nil
}

// ParseProbeSubject returns the unit and checker of a probe subject.
func ParseProbeSubject(subject string) (unit, checker string, err error) {
	t, err := parse(subject, probePrefix, probeNames)
	if err != nil {
		return "", "", err
	}
	return t[0], t[1], nil
}

// VoteSubject is where voter publishes its verdict on node of unit.
func VoteSubject(unit, node, voter string) (string, error) {
	return build(votePrefix, voteNames, unit, node, voter)
}

// ParseVoteSubject returns the unit, judged node and voter of a vote subject.
func ParseVoteSubject(subject string) (unit, node, voter string, err error) {
	t, err := parse(subject, votePrefix, voteNames)
	if err != nil {
		return "", "", "", err
	}
	return t[0], t[1], t[2], nil
}

// TopologySubject is where node's edge agent reports itself.
func TopologySubject(node string) (string, error) {
	return build(topoPrefix, topoNames, node)
}

// ParseTopologySubject returns the node of a topology subject.
func ParseTopologySubject(subject string) (node string, err error) {
	t, err := parse(subject, topoPrefix, topoNames)
	if err != nil {
		return "", err
	}
	return t[0], nil
}

// ViewSubject is where the cloud publishes its view of one object for unit.
// Use ClusterScoped as namespace for cluster-scoped objects.
func ViewSubject(unit, kind, namespace, name string) (string, error) {
	return build(viewPrefix, viewNames, unit, kind, namespace, name)
}

// UnitViewSubject is where the cloud publishes unit's membership.
func UnitViewSubject(unit string) (string, error) {
	return ViewSubject(unit, KindUnit, ClusterScoped, unit)
}

// AssignmentSubject is where the cloud tells node which unit it is in.
func AssignmentSubject(node string) (string, error) {
	return ViewSubject(NoUnit, KindAssignment, ClusterScoped, node)
}

// UnitViewSubjects matches every view published for unit.
func UnitViewSubjects(unit string) (string, error) {
	if err := ValidName(unit); err != nil {
		return "", fmt.Errorf("view subjects: unit: %w", err)
	}
	return viewPrefix + "." + Token(unit) + ".>", nil
}

// ViewKey identifies one view.
type ViewKey struct {
	Unit, Kind, Namespace, Name string
}

// ParseViewSubject returns the parts of a view subject.
func ParseViewSubject(subject string) (ViewKey, error) {
	t, err := parse(subject, viewPrefix, viewNames)
	if err != nil {
		return ViewKey{}, err
	}
	return ViewKey{Unit: t[0], Kind: t[1], Namespace: t[2], Name: t[3]}, nil
}

// TunnelSubject carries the frames of session for node in direction dir.
func TunnelSubject(node, session string, dir TunnelDir) (string, error) {
	if dir != ToEdge && dir != ToCloud {
		return "", fmt.Errorf("subject %s: dir: %w: %q is neither %q nor %q", tunnelPrefix, ErrInvalidToken, dir, ToEdge, ToCloud)
	}
	return build(tunnelPrefix, tunnelNames, node, session, string(dir))
}

// ParseTunnelSubject returns the node, session and direction of a tunnel subject.
func ParseTunnelSubject(subject string) (node, session string, dir TunnelDir, err error) {
	t, err := parse(subject, tunnelPrefix, tunnelNames)
	if err != nil {
		return "", "", "", err
	}
	d := TunnelDir(t[2])
	if d != ToEdge && d != ToCloud {
		return "", "", "", fmt.Errorf("subject %q: dir: %w: %q is neither %q nor %q", subject, ErrInvalidToken, d, ToEdge, ToCloud)
	}
	return t[0], t[1], d, nil
}
