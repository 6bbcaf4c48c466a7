package identity

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/events"
)

// Role is what an identity may do on the hub; it is the user JWT's "role"
// tag.
type Role string

const (
	// RoleService is atoll-cloud: the whole application account.
	RoleService Role = "service"
	// RoleOperator is a human or tool (atoll CLI, nats CLI): the whole
	// application account, from a client connection.
	RoleOperator Role = "operator"
	// RoleEdge is an edge node's NATS server: a leaf connection that
	// speaks only for its node and hears only its unit (EdgePermissions).
	RoleEdge Role = "edge"
	// RoleBootstrap is a one-time enrollment token: it may only ask for
	// its node's credentials.
	RoleBootstrap Role = "bootstrap"
)

// Issuer signs user JWTs of the application account with the account's
// signing key.
type Issuer struct {
	keys   *Keys
	domain string
	now    func() time.Time
}

// NewIssuer returns an issuer for the hub's JetStream domain (the edge
// permissions name its API subjects).
func NewIssuer(k *Keys, domain string) *Issuer {
	return &Issuer{keys: k, domain: domain, now: time.Now}
}

// Keys are the issuer's keys.
func (i *Issuer) Keys() *Keys { return i.keys }

// Domain is the hub's JetStream domain.
func (i *Issuer) Domain() string { return i.domain }

// ViewSigner signs the views edges relay to each other inside a unit
// (the shared object views, edge/viewfeed): with the account signing
// key, which issues every edge's user JWT, so an edge knows the public
// key from its own credentials (the JWT's issuer). The signing input
// starts with events' signature context, which no JWT's does.
func (i *Issuer) ViewSigner() events.Signer { return i.keys.AccountSigning }

func (i *Issuer) user(role Role, name, pub string, ttl time.Duration, perms jwt.Permissions, conn string, tags ...string) (string, error) {
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("identity: %s %s: %q is not an nkey user public key", role, name, pub)
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = string(role) + ":" + name
	uc.IssuerAccount = i.keys.AccountKey()
	uc.Tags.Add("role:" + string(role))
	uc.Tags.Add("name:" + name)
	uc.Permissions = perms
	for _, t := range tags {
		uc.Tags.Add(t)
	}
	switch conn {
	case "":
	case jwt.ConnectionTypeLeafnode:
		uc.AllowedConnectionTypes.Add(jwt.ConnectionTypeLeafnode, jwt.ConnectionTypeLeafnodeWS)
	case "bootstrap":
		uc.AllowedConnectionTypes.Add(jwt.ConnectionTypeStandard, jwt.ConnectionTypeLeafnode)
	default:
		uc.AllowedConnectionTypes.Add(conn, jwt.ConnectionTypeWebsocket)
	}
	if ttl > 0 {
		uc.Expires = i.now().Add(ttl).Unix()
	}
	s, err := uc.Encode(i.keys.AccountSigning)
	if err != nil {
		return "", fmt.Errorf("identity: sign %s %s: %w", role, name, err)
	}
	return s, nil
}

// System issues the JWT of a system account user (atoll-cloud pushing
// account updates to the servers' resolver), signed by the system
// account's key.
func (i *Issuer) System(name, pub string) (string, error) {
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("identity: system user %s: %q is not an nkey user public key", name, pub)
	}
	uc := jwt.NewUserClaims(pub)
	uc.Name = "system:" + name
	s, err := uc.Encode(i.keys.System)
	if err != nil {
		return "", fmt.Errorf("identity: sign system user %s: %w", name, err)
	}
	return s, nil
}

// Service issues the JWT of a cloud service (all of the application
// account).
func (i *Issuer) Service(name, pub string) (string, error) {
	return i.user(RoleService, name, pub, 0, jwt.Permissions{}, "")
}

// Operator issues the JWT of a human operator (all of the application
// account, client connections only), valid for ttl (0: no expiry).
func (i *Issuer) Operator(name, pub string, ttl time.Duration) (string, error) {
	return i.user(RoleOperator, name, pub, ttl, jwt.Permissions{}, jwt.ConnectionTypeStandard)
}

// Edge issues the JWT of node's NATS server in unit (empty: in no unit
// yet), valid for ttl (0: no expiry). It opens leaf connections only.
func (i *Issuer) Edge(node, unit, pub string, ttl time.Duration) (string, error) {
	perms, err := EdgePermissions(node, unit, i.domain)
	if err != nil {
		return "", err
	}
	var tags []string
	if unit != "" {
		tags = append(tags, "unit:"+unit)
	}
	return i.user(RoleEdge, node, pub, ttl, perms, jwt.ConnectionTypeLeafnode, tags...)
}

// EnrollSubject is where node's bootstrap token asks for its credentials.
func EnrollSubject(node string) (string, error) { return events.EnrollSubject(node) }

// RenewSubject is where node's credentials ask for fresh ones.
func RenewSubject(node string) (string, error) { return events.RenewSubject(node) }

// EnrollPrefix starts the enrollment subjects.
const EnrollPrefix = events.EnrollPrefix

// InboxPrefix is the reply inbox prefix of node's connections: the only
// inbox its credentials may hear.
func InboxPrefix(node string) string { return events.InboxPrefix(node) }

// Bootstrap issues a one-time enrollment token for node, valid for ttl:
// a client connection that may only request EnrollSubject(node).
func (i *Issuer) Bootstrap(node, unit, pub string, ttl time.Duration) (string, error) {
	if ttl <= 0 {
		return "", errors.New("identity: a bootstrap token needs a lifetime")
	}
	subj, err := EnrollSubject(node)
	if err != nil {
		return "", err
	}
	var p jwt.Permissions
	p.Pub.Allow.Add(subj)
	p.Sub.Allow.Add(InboxPrefix(node) + ".>")
	var tags []string
	if unit != "" {
		tags = append(tags, "unit:"+unit)
	}
	// A client (atoll-edge enrolling with a client URL) or the node's
	// leaf connection (enrolling through its own server).
	return i.user(RoleBootstrap, node, pub, ttl, p, "bootstrap", tags...)
}

// EdgePermissions are the subjects node's server may use on its leaf
// connection, seen from the node (publish: what it sends to the hub;
// subscribe: what the hub sends it). It publishes only in its own name:
// its probe reports, its votes, its topology updates, its tunnel frames
// to the cloud, its requests for a connection to kube-apiserver, and the JetStream API requests its consumers need on the
// VIEWS stream, filtered to its assignment and its unit's views. It hears
// its unit's probe reports and votes, its assignment, its unit's views,
// its tunnel frames from the cloud and its own inbox.
func EdgePermissions(node, unit, domain string) (jwt.Permissions, error) {
	var p jwt.Permissions
	if err := events.ValidName(node); err != nil {
		return p, fmt.Errorf("edge permissions: node: %w", err)
	}
	if unit != "" {
		if err := events.ValidUnit(unit); err != nil {
			return p, fmt.Errorf("edge permissions: unit: %w", err)
		}
	}
	if err := events.ValidToken(domain); err != nil {
		return p, fmt.Errorf("edge permissions: domain: %w", err)
	}
	self := map[string]string{"node": node}
	withUnit := func(m map[string]string) map[string]string {
		out := map[string]string{}
		for k, v := range m {
			out[k] = v
		}
		if unit != "" {
			out["unit"] = unit
		}
		return out
	}
	filters := []struct {
		f    *events.Family
		vals map[string]string
		pub  bool
	}{
		{events.BallotFamily, withUnit(map[string]string{"voter": node}), true},
		{events.TopologyFamily, self, true},
		{events.TunnelFamily, map[string]string{"node": node, "dir": string(events.ToCloud)}, true},
		// Connections of its local API endpoint to kube-apiserver
		// (--apiserver-via=hub), answered on its inbox.
		{events.APIServerDialFamily, self, true},
		// Its tunnel agent is up (subscribed to its sessions).
		{events.TunnelUpFamily, self, true},
		{events.AssignmentFamily, self, false},
		{events.TunnelFamily, map[string]string{"node": node, "dir": string(events.ToEdge)}, false},
		// Relaying a unit peer's sessions (internal/tunnelproto): in its own
		// namespace only; the unit leg (UnitRelayFamily) never crosses a
		// leaf link.
		{events.TunnelRelayFamily, map[string]string{"peer": node, "dir": string(events.ToCloud)}, true},
		{events.TunnelRelayFamily, map[string]string{"peer": node, "dir": string(events.ToEdge)}, false},
	}
	var viewFilters []string
	for _, f := range filters {
		s, err := f.f.Filter(f.vals)
		if err != nil {
			return p, err
		}
		if f.pub {
			p.Pub.Allow.Add(s)
		} else {
			p.Sub.Allow.Add(s)
		}
		if f.f == events.AssignmentFamily {
			viewFilters = append(viewFilters, s)
		}
	}
	if unit != "" {
		views, err := events.UnitViewSubjects(unit)
		if err != nil {
			return p, err
		}
		p.Sub.Allow.Add(views)
		viewFilters = append(viewFilters, views)
		// The views every unit reads, stored once (cloud/views/objects):
		// Services, slices and Endpoints (with their endpoints' topology).
		// Other units' Nodes stay in their units' spaces.
		shared := events.SharedSpaceSubjects()
		p.Sub.Allow.Add(shared)
		viewFilters = append(viewFilters, shared)
		// The shared views' republished copies in the unit's queue group
		// only: the hub sends each to one agent of the unit, which relays
		// it on the unit's routes (edge/viewfeed). A node cannot join
		// another unit's group and take its copies.
		pub, err := events.Republished(shared)
		if err != nil {
			return p, err
		}
		p.Sub.Allow.Add(pub + " " + events.ViewRelayQueue(unit))
	}
	p.Sub.Allow.Add(InboxPrefix(node) + ".>")
	renew, err := RenewSubject(node)
	if err != nil {
		return p, err
	}
	p.Pub.Allow.Add(renew)
	api := "$JS." + domain + ".API."
	for _, f := range viewFilters {
		// The same views as the hub republishes them (VIEWS' RePublish),
		// which the agent follows with core subscriptions (edge/viewfeed).
		pub, err := events.Republished(f)
		if err != nil {
			return p, err
		}
		p.Sub.Allow.Add(pub)
		// The filtered create subject (the feed's short-lived catch-up
		// consumers): the server refuses a request whose body names
		// another filter than the subject.
		p.Pub.Allow.Add(api + "CONSUMER.CREATE." + events.StreamViews + ".*." + f)
		// The last stored value of its own views, which the agent
		// compares with what it holds (edge/membership): a direct get
		// names the subject it reads.
		p.Pub.Allow.Add(api + "DIRECT.GET." + events.StreamViews + "." + f)
	}
	p.Pub.Allow.Add(api+"STREAM.INFO."+events.StreamViews,
		api+"CONSUMER.INFO."+events.StreamViews+".*",
		api+"CONSUMER.MSG.NEXT."+events.StreamViews+".*")
	return p, nil
}

// FormatCreds is the NATS credentials file of userJWT and its key.
func FormatCreds(userJWT string, kp nkeys.KeyPair) ([]byte, error) {
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("identity: credentials: %w", err)
	}
	data, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		return nil, fmt.Errorf("identity: credentials: %w", err)
	}
	return data, nil
}
