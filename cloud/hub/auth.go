package hub

import (
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"

	"github.com/atoll-edge/atoll/events"
)

// Role is what an identity may do on the hub.
type Role string

const (
	// RoleEdge is an edge node's NATS server; it connects as a leafnode only.
	RoleEdge Role = "edge"
	// RoleService is a cloud service (atoll-cloud modules).
	RoleService Role = "service"
	// RoleOperator is a human or tool with a password (atoll CLI, nats CLI).
	RoleOperator Role = "operator"
)

// Identity is an authenticated connection's principal.
type Identity struct {
	Name string
	Role Role
}

// Identities is the hub's registry of who may connect. Every connection
// authenticates: edge servers and services with an nkey signature over the
// server's nonce, operators with a password. It is safe for concurrent use
// and changes take effect for new connections at once, without a server
// reload, so the cloud can enroll and retire nodes at runtime. It also
// remembers which leaf connection authenticated with which edge key, so
// that the hub can close the live link of an edge whose key is revoked
// (RemoveEdge, or re-enrollment with another key): see Revoked and Stale.
//
// All identities land in the one application account; per-identity subject
// permissions hang off Identity (see permissions) so that per-node limits
// need no change of layout.
type Identities struct {
	mu        sync.RWMutex
	byKey     map[string]Identity // nkey public key → identity
	keyOf     map[string]string   // edge node name → its key
	operators map[string]string   // user → password or bcrypt hash
	account   func() *server.Account
	leafs     map[uint64]leafAuth // connection id → the edge key it authenticated with
	suspended map[string]bool     // edge nodes enrolled but not let in (their Node is gone)
	revoked   chan struct{}       // poked when an edge key is removed or replaced
	onKeys    []func()            // told of every edge key change (NotifyKeys)
}

// leafAuth is one leaf connection's authentication.
type leafAuth struct {
	node, key string
	at        time.Time
}

// leafGrace is how long an authenticated leaf connection is remembered
// before the server lists it (it is registered after authentication).
const leafGrace = 30 * time.Second

// NewIdentities returns an empty registry; account resolves the account
// connections are bound to (it exists only once the server runs).
func NewIdentities(account func() *server.Account) *Identities {
	return &Identities{
		byKey:     map[string]Identity{},
		keyOf:     map[string]string{},
		operators: map[string]string{},
		account:   account,
		leafs:     map[uint64]leafAuth{},
		suspended: map[string]bool{},
		revoked:   make(chan struct{}, 1),
	}
}

// Revoked is poked whenever an edge key is removed or replaced; the hub
// then closes the connections Stale names.
func (r *Identities) Revoked() <-chan struct{} { return r.revoked }

func (r *Identities) pokeRevoked() {
	select {
	case r.revoked <- struct{}{}:
	default:
	}
}

// Stale returns the leaf connections that authenticated with an edge key
// that is no longer enrolled (or no longer belongs to the same node, or
// whose node is suspended), with the node each one spoke for. alive tells
// whether the server still holds a connection; connections gone for longer
// than the time the server takes to register one are forgotten. alive is
// called without the registry's lock held.
func (r *Identities) Stale(alive func(id uint64) bool, now time.Time) map[uint64]string {
	r.mu.RLock()
	ids := make(map[uint64]leafAuth, len(r.leafs))
	for id, a := range r.leafs {
		ids[id] = a
	}
	r.mu.RUnlock()
	var gone []uint64
	live := make(map[uint64]leafAuth, len(ids))
	for id, a := range ids {
		switch {
		case alive(id):
			live[id] = a
		case now.Sub(a.at) > leafGrace:
			gone = append(gone, id)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range gone {
		delete(r.leafs, id)
	}
	out := map[uint64]string{}
	for id, a := range live {
		if cur, ok := r.byKey[a.key]; !ok || cur.Role != RoleEdge || cur.Name != a.node || r.suspended[a.node] {
			out[id] = a.node
		}
	}
	return out
}

// AddEdge lets node connect as a leafnode with the nkey public key pub. A
// node that re-enrolls with a new key loses its old one.
func (r *Identities) AddEdge(node, pub string) error {
	if err := events.ValidName(node); err != nil {
		return fmt.Errorf("enroll edge: node: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("enroll edge %s: %q is not an nkey user public key", node, pub)
	}
	defer r.keysChanged() // after the unlock
	r.mu.Lock()
	defer r.mu.Unlock()
	if other, ok := r.byKey[pub]; ok && other.Name != node {
		return fmt.Errorf("enroll edge %s: key already belongs to %s %s", node, other.Role, other.Name)
	}
	if old, ok := r.keyOf[node]; ok && old != pub {
		delete(r.byKey, old)
		defer r.pokeRevoked()
	}
	r.byKey[pub] = Identity{Name: node, Role: RoleEdge}
	r.keyOf[node] = pub
	return nil
}

// RemoveEdge forgets node: its next connection attempt is refused, and the
// hub closes its live leaf connections within seconds.
func (r *Identities) RemoveEdge(node string) {
	defer r.keysChanged() // after the unlock
	r.mu.Lock()
	defer r.mu.Unlock()
	if key, ok := r.keyOf[node]; ok {
		delete(r.byKey, key)
		delete(r.keyOf, node)
		r.pokeRevoked()
	}
}

// Suspend keeps node's key enrolled but refuses its connections and has
// the hub close its live leaf links within seconds, until Resume. The
// cloud suspends an edge whose Kubernetes Node was deleted: a kubelet that
// registers the Node again brings it back without re-enrollment.
func (r *Identities) Suspend(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.suspended[node] {
		r.suspended[node] = true
		r.pokeRevoked()
	}
}

// Resume lets a suspended node connect again.
func (r *Identities) Resume(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.suspended, node)
}

// AddService lets a cloud service connect with nkey public key pub.
func (r *Identities) AddService(name, pub string) error {
	if !nkeys.IsValidPublicUserKey(pub) {
		return fmt.Errorf("enroll service %s: %q is not an nkey user public key", name, pub)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.byKey[pub] = Identity{Name: name, Role: RoleService}
	return nil
}

// AddOperator lets user log in with password (plain or bcrypt hash).
func (r *Identities) AddOperator(user, password string) error {
	if user == "" || password == "" {
		return errors.New("enroll operator: user and password must both be set")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.operators[user] = password
	return nil
}

// Edges returns the enrolled edge nodes and their keys.
func (r *Identities) Edges() map[string]string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make(map[string]string, len(r.keyOf))
	for n, k := range r.keyOf {
		out[n] = k
	}
	return out
}

// Check implements server.Authentication.
func (r *Identities) Check(c server.ClientAuthentication) bool {
	id, err := r.authenticate(c)
	if err != nil {
		return false
	}
	acc := r.account()
	if acc == nil {
		return false
	}
	if id.Role == RoleEdge {
		r.mu.Lock()
		r.leafs[c.GetID()] = leafAuth{node: id.Name, key: c.GetOpts().Nkey, at: time.Now()}
		r.mu.Unlock()
	}
	c.RegisterUser(&server.User{Username: string(id.Role) + ":" + id.Name, Account: acc, Permissions: permissions(id)})
	return true
}

func (r *Identities) authenticate(c server.ClientAuthentication) (Identity, error) {
	opts := c.GetOpts()
	if opts.Nkey != "" {
		r.mu.RLock()
		id, ok := r.byKey[opts.Nkey]
		suspended := r.suspended[id.Name] && id.Role == RoleEdge
		r.mu.RUnlock()
		if !ok {
			return Identity{}, errors.New("unknown nkey")
		}
		if suspended {
			return Identity{}, fmt.Errorf("edge %s is suspended", id.Name)
		}
		if err := verifyNonce(opts.Nkey, opts.Sig, c.GetNonce()); err != nil {
			return Identity{}, err
		}
		// Edge keys open leaf connections only; a stolen node key cannot
		// be used as a plain client.
		if (id.Role == RoleEdge) != (c.Kind() == server.LEAF) {
			return Identity{}, fmt.Errorf("%s %s may not connect as kind %d", id.Role, id.Name, c.Kind())
		}
		return id, nil
	}
	if opts.Username != "" && c.Kind() == server.CLIENT {
		r.mu.RLock()
		want, ok := r.operators[opts.Username]
		r.mu.RUnlock()
		if ok && passwordMatches(want, opts.Password) {
			return Identity{Name: opts.Username, Role: RoleOperator}, nil
		}
	}
	return Identity{}, errors.New("no valid credentials")
}

func verifyNonce(pub, sig string, nonce []byte) error {
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return err
	}
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		if raw, err = base64.StdEncoding.DecodeString(sig); err != nil {
			return fmt.Errorf("signature encoding: %w", err)
		}
	}
	return kp.Verify(nonce, raw)
}

func passwordMatches(want, got string) bool {
	if strings.HasPrefix(want, "$2") {
		return bcrypt.CompareHashAndPassword([]byte(want), []byte(got)) == nil
	}
	return subtle.ConstantTimeCompare([]byte(want), []byte(got)) == 1
}

// permissions returns the subject permissions of id. Today every identity
// may use the whole application account; per-node limits (a node publishes
// only its own subjects) attach here.
func permissions(Identity) *server.Permissions { return nil }
