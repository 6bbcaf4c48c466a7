package events

import (
	"fmt"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Transport says how the messages of a subject family travel.
type Transport string

const (
	// TransportStream: published to a hub stream (directly, or by an edge
	// server through its leaf link) and read with Consume.
	TransportStream Transport = "stream"
	// TransportCore: core NATS publish/subscribe, stored nowhere.
	TransportCore Transport = "core"
	// TransportRequest: core NATS request/reply, answered by a micro
	// service endpoint in a queue group.
	TransportRequest Transport = "request/reply"
)

// Family describes one family of subjects: its pattern, how it travels,
// what it carries and who speaks on it. The table of families (Catalog) is
// the one source of the stream subjects (Streams), the subject builders and
// parsers, payload identity checks (CheckIdentity), TypeForSubject and the
// subject catalog of docs/reference/subjects.md (CatalogMarkdown).
type Family struct {
	// Name identifies the family in the catalog.
	Name string
	// Pattern is the subject with its variable tokens named in angle
	// brackets, e.g. "atoll.health.ballot.<unit>.<voter>". A name that
	// appears twice stands for the same value both times.
	Pattern string
	// Values restricts a named token to a fixed set of values.
	Values map[string][]string
	// Transport and, for TransportStream, the Stream that stores the family.
	Transport Transport
	Stream    string
	// Message is what is published on the subject (the request, for
	// request/reply); Reply is the answer of a request/reply family.
	Message proto.Message
	Reply   proto.Message
	// Identity maps named tokens to the string fields of Message that must
	// hold the same value: a payload cannot claim another node's subject.
	Identity map[string]string
	// Service and Endpoint name the micro endpoint of a request/reply family.
	Service, Endpoint string
	// MsgID is the rule producers follow for Nats-Msg-Id.
	MsgID string
	// Producer and Consumer say who publishes and who reads.
	Producer, Consumer string
	// Example holds one value per distinct named token, in order, for an
	// example subject of the family.
	Example []string

	tokens []token
	names  []string // distinct named tokens, in order of appearance
}

type token struct {
	literal string // set for a literal token
	name    string // set for a named token
}

// Stream families and what they carry. Their order is the catalog's order.
var (
	ProbeFamily = &Family{
		Name: "probe", Pattern: Root + ".health.probe.<unit>.<checker>",
		// Probe reports stay inside the unit: the unit's routes carry
		// them to its voters, and the edge credentials may not send them
		// over the leaf link, so the hub never sees them (see Ballot).
		Transport: TransportCore,
		Message:   &atollv1.ProbeReport{},
		Identity:  map[string]string{"unit": "unit", "checker": "checker"},
		MsgID:     "`<checker>@<epoch>-<sequence>`",
		Producer:  "edge prober", Consumer: "unit voters (core, over the unit's routes); never sent to the hub",
		Example: []string{"site-a", "edge-1"},
	}
	// BallotFamily carries one voter's votes on all its unit's other
	// members, the only health message that reaches the cloud: sent on
	// change (acknowledged by the stream, retried until it is) and as a
	// slow keep-alive.
	BallotFamily = &Family{
		Name: "ballot", Pattern: Root + ".health.ballot.<unit>.<voter>",
		Transport: TransportStream, Stream: StreamHealth,
		Message:  &atollv1.Ballot{},
		Identity: map[string]string{"unit": "unit", "voter": "voter"},
		MsgID:    "`<voter>@<unix ns, base 36>`",
		Producer: "edge voter", Consumer: "cloud health: every replica follows, one handles each (`health-ballots`)",
		Example: []string{"site-a", "edge-1"},
	}
	TopologyFamily = &Family{
		Name: "topology", Pattern: Root + ".topo.node.<node>",
		Transport: TransportStream, Stream: StreamTopology,
		Message:  &atollv1.TopologyUpdate{},
		Identity: map[string]string{"node": "node"},
		MsgID:    "`<node>@<unix ns>`",
		Producer: "edge reporter", Consumer: "cloud topology (every replica follows)",
		Example: []string{"edge-1"},
	}
	// UnitEventFamily: the unit lifecycle events of the grid
	// controllers, in the TOPOLOGY stream beside the nodes' reports.
	UnitEventFamily = &Family{
		Name: "unit event", Pattern: Root + ".topo.unit.<unit>",
		Transport: TransportStream, Stream: StreamTopology,
		Message:  &atollv1.UnitEvent{},
		Identity: map[string]string{"unit": "unit"},
		MsgID:    "`<subject>@<fingerprint>@<seq replaced>`, published expecting that last subject sequence",
		Producer: "cloud topology (when a unit appears, its members change or it is gone)", Consumer: "cloud grid controllers: replicas share one durable consumer (`grid-units`)",
		Example: []string{"site-a"},
	}
	AssignmentFamily = &Family{
		Name: "assignment", Pattern: Root + ".view." + NoUnit + "." + KindAssignment + "." + ClusterScoped + ".<node>",
		Transport: TransportStream, Stream: StreamViews,
		Message:  &atollv1.NodeAssignment{},
		Identity: map[string]string{"node": "node"},
		MsgID:    "`<subject>@<fingerprint>@<seq replaced>`, published expecting that last subject sequence",
		Producer: "cloud topology", Consumer: "the node's edge membership",
		Example: []string{"edge-1"},
	}
	UnitViewFamily = &Family{
		Name: "unit view", Pattern: Root + ".view.<unit>." + KindUnit + "." + ClusterScoped + ".<unit>",
		Transport: TransportStream, Stream: StreamViews,
		Message:  &atollv1.UnitView{},
		Identity: map[string]string{"unit": "unit"},
		MsgID:    "`<subject>@<fingerprint>@<seq replaced>`, published expecting that last subject sequence",
		Producer: "cloud topology", Consumer: "the unit's edge membership",
		Example: []string{"site-a"},
	}
	HostsFamily = &Family{
		Name: "hosts", Pattern: Root + ".view.<unit>." + KindHosts + "." + ClusterScoped + ".<unit>",
		Transport: TransportStream, Stream: StreamViews,
		Message:  &atollv1.HostRecords{},
		Identity: map[string]string{"unit": "unit"},
		MsgID:    "`<subject>@<fingerprint>@<seq replaced>`, published expecting that last subject sequence",
		Producer: "cloud host records", Consumer: "the unit's hosts writers",
		Example: []string{"site-a"},
	}
	// ObjectViewFamily: the object views of cloud/views/objects. The
	// unit token SharedSpace holds what every unit reads, once.
	ObjectViewFamily = &Family{
		Name: "object view", Pattern: Root + ".view.<unit>.<kind>.<namespace>.<name>",
		Transport: TransportStream, Stream: StreamViews,
		Message:  &atollv1.ObjectView{},
		Identity: map[string]string{"kind": "kind", "name": "name"},
		MsgID:    "`<subject>@<fingerprint>@<seq replaced>`, published expecting that last subject sequence",
		Producer: "cloud object views (unit `_all`: Services, slices and Endpoints, stored once, a slice's or Endpoints' view with its endpoints' nodes' topology; a unit: its own Nodes in full)", Consumer: "the endpoint proxies of the unit (`_all`: of every unit)",
		Example: []string{"site-a", "endpointslices", "default", "web-abc"},
	}
	// The views as the hub republishes them (VIEWS' RePublish), one
	// family per view family: what an edge agent follows with core
	// subscriptions on its own spaces (edge/viewfeed), catching up with a
	// short-lived consumer on VIEWS when it may have missed one.
	RepublishedAssignmentFamily = republished(AssignmentFamily, "the node's edge membership (core, `edge/viewfeed`)")
	RepublishedUnitViewFamily   = republished(UnitViewFamily, "the unit's edge membership (core, `edge/viewfeed`)")
	RepublishedHostsFamily      = republished(HostsFamily, "the unit's hosts writers (core, `edge/viewfeed`)")
	RepublishedObjectViewFamily = republished(ObjectViewFamily, "the endpoint proxies of the unit (core, `edge/viewfeed`; `_all`: of every unit)")
	// RelayedViewFamily: a shared-space view relayed inside a unit. The
	// hub sends each republished shared view to one agent per unit (the
	// queue group named after the unit), which publishes it again here,
	// on the unit's routes only (edge/viewfeed).
	RelayedViewFamily = &Family{
		Name: "relayed view", Pattern: Root + "." + viewRelayToken + ".<unit>.<kind>.<namespace>.<name>",
		Transport: TransportCore,
		Message:   &atollv1.ObjectView{},
		Identity:  map[string]string{"kind": "kind", "name": "name"},
		MsgID:     "the stored message's, with the hub's headers and the cloud's signature (`Atoll-Signature`, over the view's subject in VIEWS and its payload) kept",
		Producer:  "the agent of the unit the hub picked for the view", Consumer: "the endpoint proxies of the unit (core, over the unit's routes); never sent to the hub",
		Example: []string{"site-a", "endpointslices", "default", "web-abc"},
	}
	// RelayResetFamily: an agent of the unit whose leaf link changed
	// tells the others that views it was given to relay may be lost.
	RelayResetFamily = &Family{
		Name: "relay reset", Pattern: Root + "." + viewRelayToken + ".<unit>.<node>.reset",
		Transport: TransportCore,
		Message:   &atollv1.ViewRelayReset{},
		Identity:  map[string]string{"node": "node"},
		MsgID:     "none",
		Producer:  "an agent of the unit, when its leaf link to the hub comes up (and again once the hub has surely dropped the old one)", Consumer: "the unit's other agents' relayed feeds: a catch-up (core, over the unit's routes); never sent to the hub",
		Example: []string{"site-a", "edge-1"},
	}

	TunnelFamily = &Family{
		Name: "tunnel", Pattern: Root + ".tunnel.<node>.<session>.<dir>",
		Values:    map[string][]string{"dir": {string(ToEdge), string(ToCloud)}},
		Transport: TransportCore,
		Message:   &atollv1.TunnelFrame{},
		Identity:  map[string]string{"session": "session"},
		MsgID:     "none",
		Producer:  "tunnel server or edge agent", Consumer: "the other end of the session",
		Example: []string{"edge-1", "s1", string(ToEdge)},
	}
	// TunnelRelayFamily is the hub leg of a session relayed through a
	// unit peer of the node (internal/tunnelproto, "Relay"): in the relaying
	// peer's own namespace, so its credentials allow exactly its own.
	TunnelRelayFamily = &Family{
		Name: "tunnel relay", Pattern: Root + ".tunnel.<peer>.relay.<node>.<session>.<dir>",
		Values:    map[string][]string{"dir": {string(ToEdge), string(ToCloud)}},
		Transport: TransportCore,
		Message:   &atollv1.TunnelFrame{},
		Identity:  map[string]string{"session": "session"},
		MsgID:     "none",
		Producer:  "tunnel server (`in`) or the relaying peer's agent (`out`)", Consumer: "the relaying peer's agent (`in`) or the tunnel server (`out`)",
		Example: []string{"edge-2", "edge-1", "s1", string(ToEdge)},
	}
	// UnitRelayFamily is the unit leg of a relayed session, between the
	// relaying peer's agent and the node's: core NATS over the unit's
	// routes; the edge credentials may not send it over a leaf link.
	UnitRelayFamily = &Family{
		Name: "unit relay", Pattern: Root + ".relay.<unit>.<peer>.<node>.<session>.<dir>",
		Values:    map[string][]string{"dir": {string(ToEdge), string(ToCloud)}},
		Transport: TransportCore,
		Message:   &atollv1.TunnelFrame{},
		Identity:  map[string]string{"session": "session"},
		MsgID:     "none",
		Producer:  "the relaying peer's agent (`in`) or the node's agent (`out`)", Consumer: "the other agent (core, over the unit's routes); never sent to the hub",
		Example: []string{"site-a", "edge-2", "edge-1", "s1", string(ToEdge)},
	}
	// APIServerDialFamily: a node's request for a connection to
	// kube-apiserver through the hub (edge/tunnel, a node's local API
	// endpoint with --apiserver-via=hub); the answering replica opens a
	// TunnelFamily session to the node and relays it to kube-apiserver.
	APIServerDialFamily = &Family{
		Name: "apiserver dial", Pattern: Root + ".tunnel.<node>.apiserver",
		Transport: TransportRequest,
		Message:   &atollv1.APIServerDial{}, Reply: &atollv1.APIServerDialed{},
		Identity: map[string]string{"node": "node"},
		Service:  TunnelService, Endpoint: "apiserver",
		MsgID:    "none",
		Producer: "the node's tunnel agent, for each connection of its local API endpoint", Consumer: "one atoll-cloud replica with `--tunnel-apiserver` (queue group `" + TunnelService + "`)",
		Example: []string{"edge-1"},
	}
	// TunnelUpFamily: a node's tunnel agent announcing that it subscribed
	// to its sessions, so sessions opened while it (re)started need not
	// wait for their next resend.
	TunnelUpFamily = &Family{
		Name: "tunnel agent up", Pattern: Root + ".tunnel.<node>.up",
		Transport: TransportCore,
		Message:   &atollv1.TunnelAgentUp{},
		Identity:  map[string]string{"node": "node"},
		MsgID:     "none",
		Producer:  "the node's tunnel agent, once its sessions' subscriptions are in place", Consumer: "every tunnel server replica: it resends the OPEN of its sessions to the node still unanswered",
		Example: []string{"edge-1"},
	}
	StatusFamily = &Family{
		Name: "status", Pattern: StatusSubject,
		Transport: TransportRequest,
		Message:   &atollv1.StatusRequest{}, Reply: &atollv1.ClusterStatus{},
		Service: CloudService, Endpoint: "status",
		MsgID:    "none",
		Producer: "`atoll status`", Consumer: "one atoll-cloud replica (queue group `" + CloudService + "`)",
	}
	TunnelsFamily = &Family{
		Name: "tunnel sessions", Pattern: TunnelsSubject,
		Transport: TransportRequest,
		Message:   &atollv1.TunnelSessionsRequest{}, Reply: &atollv1.TunnelSessions{},
		Service: CloudService, Endpoint: "tunnels",
		MsgID:    "none",
		Producer: "the atoll-cloud replica answering a status request", Consumer: "every atoll-cloud replica (no queue group)",
	}
)

// catalog is every family, in the catalog's order.
var catalog = []*Family{
	ProbeFamily, BallotFamily, TopologyFamily, UnitEventFamily,
	AssignmentFamily, UnitViewFamily, HostsFamily, ObjectViewFamily,
	RepublishedAssignmentFamily, RepublishedUnitViewFamily, RepublishedHostsFamily, RepublishedObjectViewFamily,
	RelayedViewFamily, RelayResetFamily,
	TunnelFamily, TunnelRelayFamily, UnitRelayFamily, APIServerDialFamily, TunnelUpFamily, StatusFamily, TunnelsFamily,
}

// republished is view family f as the hub republishes it: the same
// tokens and payload under ViewRepublishSubjects, core NATS, with the
// stream's headers (Nats-Stream, Nats-Subject, Nats-Sequence,
// Nats-Time-Stamp, Nats-Last-Sequence).
func republished(f *Family, consumer string) *Family {
	pattern, err := Republished(f.Pattern)
	if err != nil {
		panic(err)
	}
	return &Family{
		Name: f.Name + " (republished)", Pattern: pattern, Values: f.Values,
		Transport: TransportCore,
		Message:   f.Message, Identity: f.Identity,
		MsgID:    "the stored message's; `Nats-Sequence` and `Nats-Last-Sequence` (the subject's previous sequence) added by the hub",
		Producer: "the hub (VIEWS' RePublish of " + f.Name + ")", Consumer: consumer,
		Example: f.Example,
	}
}

func init() {
	for _, f := range catalog {
		if err := f.compile(); err != nil {
			panic(err)
		}
	}
}

// Catalog returns every subject family.
func Catalog() []*Family { return slices.Clone(catalog) }

func (f *Family) compile() error {
	for _, t := range strings.Split(f.Pattern, ".") {
		if n, ok := strings.CutPrefix(t, "<"); ok {
			n, ok = strings.CutSuffix(n, ">")
			if !ok || n == "" {
				return fmt.Errorf("catalog %s: bad token %q in %q", f.Name, t, f.Pattern)
			}
			f.tokens = append(f.tokens, token{name: n})
			if !slices.Contains(f.names, n) {
				f.names = append(f.names, n)
			}
			continue
		}
		if err := ValidToken(t); err != nil {
			return fmt.Errorf("catalog %s: %w", f.Name, err)
		}
		f.tokens = append(f.tokens, token{literal: t})
	}
	return nil
}

// Names are the distinct named tokens of the pattern, in order.
func (f *Family) Names() []string { return slices.Clone(f.names) }

// Wildcard is the pattern with every named token replaced by '*': the
// filter that matches the whole family.
func (f *Family) Wildcard() string {
	out := make([]string, len(f.tokens))
	for i, t := range f.tokens {
		out[i] = cmpOr(t.literal, "*")
	}
	return strings.Join(out, ".")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// literals counts the fixed tokens: the more, the more specific the family.
func (f *Family) literals() int {
	n := 0
	for _, t := range f.tokens {
		if t.literal != "" {
			n++
		}
	}
	return n
}

// Subject builds the family's subject from values, one per named token
// (see Names). Values are names: dots travel as '~' (see Token).
func (f *Family) Subject(values ...string) (string, error) {
	if len(values) != len(f.names) {
		return "", fmt.Errorf("subject %s: %d values for <%s>", f.Pattern, len(values), strings.Join(f.names, ">, <"))
	}
	byName := make(map[string]string, len(values))
	for i, v := range values {
		if v == "" {
			return "", emptyName(f.names[i])
		}
		if err := ValidName(v); err != nil {
			return "", fmt.Errorf("subject %s: %s: %w", f.Pattern, f.names[i], err)
		}
		if err := f.checkValue(f.names[i], v); err != nil {
			return "", fmt.Errorf("subject %s: %w", f.Pattern, err)
		}
		byName[f.names[i]] = Token(v)
	}
	out := make([]string, len(f.tokens))
	for i, t := range f.tokens {
		out[i] = cmpOr(t.literal, byName[t.name])
	}
	return strings.Join(out, "."), nil
}

func (f *Family) checkValue(name, v string) error {
	if allowed, ok := f.Values[name]; ok && !slices.Contains(allowed, v) {
		return fmt.Errorf("%s: %w: %q is not one of %q", name, ErrInvalidToken, v, allowed)
	}
	return nil
}

// Parse returns the values (names) of the named tokens of subject, in the
// order of Names, or an error wrapping ErrWrongSubject, ErrInvalidToken or
// ErrEmptyToken when subject is not of the family.
func (f *Family) Parse(subject string) ([]string, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != len(f.tokens) {
		return nil, fmt.Errorf("%w: %q: want %s", ErrWrongSubject, subject, f.Pattern)
	}
	byName := map[string]string{}
	for i, t := range f.tokens {
		p := parts[i]
		if t.literal != "" {
			if p != t.literal {
				return nil, fmt.Errorf("%w: %q: want %s", ErrWrongSubject, subject, f.Pattern)
			}
			continue
		}
		if err := ValidToken(p); err != nil {
			return nil, fmt.Errorf("subject %q: %s: %w", subject, t.name, err)
		}
		v := Name(p)
		if err := f.checkValue(t.name, v); err != nil {
			return nil, fmt.Errorf("subject %q: %w", subject, err)
		}
		if prev, ok := byName[t.name]; ok && prev != v {
			return nil, fmt.Errorf("%w: %q: <%s> is both %q and %q", ErrWrongSubject, subject, t.name, prev, v)
		}
		byName[t.name] = v
	}
	out := make([]string, len(f.names))
	for i, n := range f.names {
		out[i] = byName[n]
	}
	return out, nil
}

// ExampleSubject is the family's subject built from Example.
func (f *Family) ExampleSubject() (string, error) { return f.Subject(f.Example...) }

// FamilyOf returns the most specific family subject belongs to (the one
// with the most fixed tokens; views of kind "unit" are unit views, not
// object views).
func FamilyOf(subject string) (*Family, error) {
	var best *Family
	for _, f := range catalog {
		if _, err := f.Parse(subject); err != nil {
			continue
		}
		if best == nil || f.literals() > best.literals() {
			best = f
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: %q", ErrWrongSubject, subject)
	}
	return best, nil
}

// familyOfType returns the family of subject that carries messages of
// type m; when subject is of no such family (or the type travels in one
// family only), the first family carrying the type, whose parse then names
// the mismatch. Nil when no family carries the type.
func familyOfType(subject string, m proto.Message) *Family {
	name := TypeName(m)
	if f, err := FamilyOf(subject); err == nil && TypeName(f.Message) == name {
		return f
	}
	for _, f := range catalog {
		if TypeName(f.Message) == name {
			return f
		}
	}
	return nil
}

// TypeForSubject names the message type a catalog subject carries, for
// messages that arrive without a type header (e.g. published by hand).
func TypeForSubject(subject string) (string, error) {
	f, err := FamilyOf(subject)
	if err != nil {
		return "", err
	}
	return TypeName(f.Message), nil
}

// checkIdentity verifies m's identity fields against subject, parsed with
// f's pattern.
func (f *Family) checkIdentity(subject string, m proto.Message) error {
	values, err := f.Parse(subject)
	if err != nil {
		return err
	}
	fields := m.ProtoReflect().Descriptor().Fields()
	for i, name := range f.names {
		field, ok := f.Identity[name]
		if !ok {
			continue
		}
		fd := fields.ByName(protoreflect.Name(field))
		if fd == nil {
			return fmt.Errorf("catalog %s: %s has no field %q", f.Name, TypeName(m), field)
		}
		if got := m.ProtoReflect().Get(fd).String(); got != values[i] {
			return fmt.Errorf("%w: %s=%q but subject %q says %q", ErrIdentity, field, got, subject, values[i])
		}
	}
	return nil
}
