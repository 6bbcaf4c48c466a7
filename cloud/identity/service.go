package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes the identity service.
type Config struct {
	// EdgeTTL is the lifetime of an edge node's credentials (0: no
	// expiry); the node renews them before they expire.
	EdgeTTL time.Duration
	// MaxTokenTTL caps the lifetime of a bootstrap token.
	MaxTokenTTL time.Duration
	// Replicas of the registry's KV bucket (1, or 3 on a hub cluster).
	Replicas int
	// SpentTokenGrace is how long a spent bootstrap token's user may
	// still log in after its enrollment reply (DefaultSpentTokenGrace).
	SpentTokenGrace time.Duration
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config {
	return Config{EdgeTTL: 30 * 24 * time.Hour, MaxTokenTTL: 7 * 24 * time.Hour, Replicas: 1, SpentTokenGrace: DefaultSpentTokenGrace}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.EdgeTTL < 0:
		return fmt.Errorf("identity: edge credentials TTL %v is negative", c.EdgeTTL)
	case c.EdgeTTL > 0 && c.EdgeTTL < time.Minute:
		return fmt.Errorf("identity: edge credentials TTL %v is shorter than a minute", c.EdgeTTL)
	case c.MaxTokenTTL <= 0:
		return fmt.Errorf("identity: max bootstrap token TTL %v must be positive", c.MaxTokenTTL)
	case c.Replicas != 1 && c.Replicas != 3:
		return fmt.Errorf("identity: replicas %d must be 1 or 3", c.Replicas)
	case c.SpentTokenGrace <= 0:
		return fmt.Errorf("identity: spent token grace %v must be positive", c.SpentTokenGrace)
	}
	return nil
}

// Bucket is the hub KV bucket of the identity registry: one entry per
// node (its key, unit and state) and one per used bootstrap token.
const Bucket = "atoll-identity"

// Subjects of the identity service's endpoints (service ServiceName).
const (
	ServiceName    = "atoll-identity"
	RevokeSubject  = events.Root + ".identity.revoke"
	TokenSubject   = events.Root + ".identity.token"
	enrollWildcard = EnrollPrefix + "*"
	renewWildcard  = EnrollPrefix + "*.renew"
)

// Record is what the registry keeps of one node.
type Record struct {
	Node string `json:"node"`
	// Key is the node's nkey public key.
	Key  string `json:"key"`
	Unit string `json:"unit,omitempty"`
	// Revoked: the key is revoked for good (atoll node revoke).
	Revoked bool `json:"revoked,omitempty"`
	// Suspended: the key is revoked until the node's Kubernetes Node
	// comes back.
	Suspended bool      `json:"suspended,omitempty"`
	Issued    time.Time `json:"issued"`
}

// Service is atoll-cloud's identity service: it issues and records the
// edge nodes' credentials, revokes them, and enrolls nodes that present a
// one-time bootstrap token.
type Service struct {
	cfg     Config
	issuer  *Issuer
	revoker *Revoker
	nc      *nats.Conn
	log     *slog.Logger
	metrics *Metrics

	kv  jetstream.KeyValue
	js  jetstream.JetStream
	svc micro.Service
	// kube enrolls nodes by their pods' ServiceAccount tokens (nil: off).
	kube *Kubernetes
	// durable keeps the registry's durable part outside the hub (nil:
	// off); dirty asks keepDurable to save it again.
	durable     Durable
	dirty       chan struct{}
	durableDone chan struct{}

	mu       sync.RWMutex
	nodes    map[string]Record
	onKeys   []func() // NotifyKeys callbacks
	stop     context.CancelFunc
	done     chan struct{}
	closeSys func()

	// sys is a system account user's connection (nil: no revocations
	// pushed, no violations followed); violSub follows the hub servers'
	// violations on it (FollowViolations).
	sys     *nats.Conn
	violSub *nats.Subscription

	// spent are the revocations of spent bootstrap tokens waiting out
	// SpentTokenGrace; Stop runs them at once.
	spentMu sync.Mutex
	spent   map[*time.Timer]func()
	swept   chan struct{} // closed when the sweep at start ended
}

// DefaultSpentTokenGrace is how long a spent bootstrap token's user may
// still log in: its enrollment reply reaches the node first. Revoking it
// at once closed its connection right behind the reply, and the node's
// client lost the reply to the close (nats.go hands a reply to the
// waiting request on another goroutine than the one that reads the
// server's close): the node was enrolled, its token spent, and it had
// no credentials. The user can only ask for an enrollment meanwhile,
// which the spent token's record refuses. A replica that dies within the
// grace leaves the revocation to the next start of any replica
// (SweepSpent).
const DefaultSpentTokenGrace = 5 * time.Second

// NewService returns the service; nc is a service connection, sys a
// system account user's (Issuer.System).
func NewService(cfg Config, issuer *Issuer, nc, sys *nats.Conn, log *slog.Logger, m *Metrics) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	s := &Service{cfg: cfg, issuer: issuer, nc: nc,
		log: log.With("component", "identity"), metrics: m, nodes: map[string]Record{}}
	s.useSystem(sys)
	return s, nil
}

// useSystem has the service push revocations and follow the hub
// servers' violations over sys (nil: neither). Call it before Start.
func (s *Service) useSystem(sys *nats.Conn) {
	s.sys = sys
	if sys != nil {
		s.revoker = NewRevoker(s.issuer.Keys(), sys)
	}
}

// EnrollKubernetes turns on Kubernetes enrollment (see Kubernetes). Call
// it before Start.
func (s *Service) EnrollKubernetes(k *Kubernetes) { s.kube = k }

// KeepDurable keeps the registry's revocations and the records of revoked
// and suspended nodes in d, and restores them into a registry that lost
// them (see Durable). Call it before Start.
func (s *Service) KeepDurable(d Durable) { s.durable = d }

// Revoker is the service's revoker.
func (s *Service) Revoker() *Revoker { return s.revoker }

// Start opens the registry, follows it and serves the endpoints.
func (s *Service) Start(ctx context.Context) error {
	js, err := jetstream.NewWithDomain(s.nc, s.issuer.Domain())
	if err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	s.js = js
	err = eventbus.UntilSet(ctx, func(ctx context.Context) (err error) {
		s.kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: Bucket, Replicas: s.cfg.Replicas, History: 1,
			Description: "Atoll node identities and used bootstrap tokens"})
		return err
	})
	if err != nil {
		return fmt.Errorf("identity: registry bucket: %w", err)
	}
	s.revoker.UseRegistry(s.kv)
	// The watchers follow the registry for as long as the service runs,
	// not for as long as ctx (the start's deadline): a watcher ends with
	// the context it was made with.
	wctx, cancel := context.WithCancel(context.Background())
	running := false
	defer func() {
		if !running {
			cancel()
		}
	}()
	w, err := s.kv.Watch(wctx, "node.>")
	if err != nil {
		return fmt.Errorf("identity: watch registry: %w", err)
	}
	// Caught up once the watcher sends its nil marker.
	if err := s.catchUp(ctx, w); err != nil {
		return err
	}
	if s.durable != nil {
		if err := s.restoreDurable(ctx); err != nil {
			return err
		}
	}
	revs, err := s.kv.Watch(wctx, revocationsKey, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("identity: watch revocations: %w", err)
	}
	running = true
	s.stop, s.done = cancel, make(chan struct{})
	if s.durable != nil {
		s.dirty, s.durableDone = make(chan struct{}, 1), make(chan struct{})
		s.markDirty()
		go func() {
			defer close(s.durableDone)
			s.keepDurable(wctx)
		}()
	}
	go func() {
		defer close(s.done)
		defer func() { _ = w.Stop(); _ = revs.Stop() }()
		// Every replica pushes the registry's revocations when they
		// change and now and then: the last push carries the newest list
		// even when two replicas changed it at once.
		sync := time.NewTicker(revocationSync)
		defer sync.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					s.apply(e)
				}
				continue
			case <-revs.Updates():
				s.markDirty()
			case <-sync.C:
			}
			sctx, cancel := context.WithTimeout(wctx, gateTimeout)
			if err := s.revoker.Sync(sctx); err != nil && wctx.Err() == nil {
				s.log.Warn("push revocations to the resolver", "err", err)
			}
			cancel()
		}
	}()
	if s.revoker != nil {
		s.swept = make(chan struct{})
		go func() {
			defer close(s.swept)
			s.sweepAtStart(wctx)
		}()
	}
	if s.sys != nil {
		if s.violSub, err = FollowViolations(s.sys, s.issuer.Keys().AccountKey(), s.log, s.metrics); err != nil {
			return err
		}
	}
	s.svc, err = micro.AddService(s.nc, micro.Config{Name: ServiceName, Version: "1.0.0",
		Description: "Atoll node enrollment, renewal and revocation", QueueGroup: ServiceName})
	if err != nil {
		return fmt.Errorf("identity: micro service: %w", err)
	}
	endpoints := []struct {
		name, subject string
		h             func(micro.Request) (any, error)
	}{
		{"revoke", RevokeSubject, s.handleRevoke},
		{"token", TokenSubject, s.handleToken},
		{"enroll", enrollWildcard, s.handleEnroll},
		{"renew", renewWildcard, s.handleRenew},
	}
	if s.kube != nil {
		endpoints = append(endpoints, struct {
			name, subject string
			h             func(micro.Request) (any, error)
		}{"enroll-k8s", events.EnrollKubernetesWildcard, s.handleEnrollKubernetes})
		go s.keepEnrollCreds(wctx)
	}
	for _, ep := range endpoints {
		if err := s.svc.AddEndpoint(ep.name, s.endpoint(ep.name, ep.h), micro.WithEndpointSubject(ep.subject)); err != nil {
			return fmt.Errorf("identity: endpoint %s: %w", ep.name, err)
		}
	}
	return nil
}

// catchUp applies the registry's records until w sends its nil marker.
func (s *Service) catchUp(ctx context.Context, w jetstream.KeyWatcher) error {
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("identity: read the registry: %w", ctx.Err())
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return errors.New("identity: read the registry: the watcher stopped")
			case e == nil:
				return nil
			}
			s.apply(e)
		}
	}
}

// Stop stops serving. Spent bootstrap tokens waiting out their grace
// are revoked first.
func (s *Service) Stop() error {
	s.revokeSpent()
	if s.stop != nil {
		s.stop()
		<-s.done
		if s.swept != nil {
			<-s.swept
		}
		if s.durableDone != nil {
			<-s.durableDone
		}
	}
	var err error
	if s.svc != nil {
		err = s.svc.Stop()
	}
	if s.violSub != nil {
		_ = s.violSub.Unsubscribe()
	}
	if s.closeSys != nil {
		s.closeSys()
	}
	return err
}

func (s *Service) apply(e jetstream.KeyValueEntry) {
	defer s.markDirty()
	node := events.Name(strings.TrimPrefix(e.Key(), "node."))
	if e.Operation() != jetstream.KeyValuePut {
		s.set(node, Record{}, false)
		return
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		s.log.Warn("identity registry: undecodable entry", "key", e.Key(), "err", err)
		return
	}
	s.set(node, r, true)
}

// set records (or, with ok false, forgets) node's record, and tells the
// NotifyKeys callbacks when the key NodeKey answers for it changed.
func (s *Service) set(node string, r Record, ok bool) {
	s.mu.Lock()
	before, _ := validKey(s.nodes[node], true)
	if ok {
		s.nodes[node] = r
	} else {
		delete(s.nodes, node)
	}
	after, _ := validKey(r, ok)
	notify := s.onKeys
	s.mu.Unlock()
	if before != after {
		for _, f := range notify {
			f()
		}
	}
}

// NotifyKeys has f called after a node's key (as NodeKey answers) is
// added, replaced or removed — by this replica or another; f must not
// block (topology.NodeKeys).
func (s *Service) NotifyKeys(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onKeys = append(s.onKeys, f)
}

func validKey(r Record, ok bool) (string, bool) {
	if !ok || r.Revoked || r.Suspended || r.Key == "" {
		return "", false
	}
	return r.Key, true
}

func nodeKey(node string) string { return "node." + events.Token(node) }

func (s *Service) put(ctx context.Context, r Record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.kv.Put(ctx, nodeKey(r.Node), data); err != nil {
		return fmt.Errorf("identity: record %s: %w", r.Node, err)
	}
	s.set(r.Node, r, true)
	return nil
}

// Record returns what the registry knows of node.
func (s *Service) Record(node string) (Record, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	r, ok := s.nodes[node]
	return r, ok
}

// NodeKey is node's nkey public key, while its credentials are valid
// (not revoked, not suspended): what peers verify its signatures with.
func (s *Service) NodeKey(node string) (string, bool) {
	return validKey(s.Record(node))
}

// IssueEdge issues node's credentials in unit for its key pub and records
// them. A node that had another key loses it (revoked).
func (s *Service) IssueEdge(ctx context.Context, node, unit, pub string) (string, error) {
	old, had := s.Record(node)
	userJWT, err := s.issuer.Edge(node, unit, pub, s.cfg.EdgeTTL)
	if err != nil {
		return "", err
	}
	if had && old.Key != pub && !old.Revoked {
		if err := s.revoker.Revoke(ctx, old.Key); err != nil {
			return "", err
		}
	}
	if err := s.put(ctx, Record{Node: node, Key: pub, Unit: unit, Issued: time.Now().UTC()}); err != nil {
		return "", err
	}
	s.metrics.issued.Inc()
	return userJWT, nil
}

// Revoke revokes node's credentials for good: its live leaf connection
// is closed within seconds and it cannot connect again with them.
func (s *Service) Revoke(ctx context.Context, node string) (Record, error) {
	r, ok := s.Record(node)
	if !ok {
		return Record{}, fmt.Errorf("%w: %s", ErrUnknownNode, node)
	}
	if err := s.revoker.Revoke(ctx, r.Key); err != nil {
		return Record{}, err
	}
	r.Revoked = true
	if err := s.put(ctx, r); err != nil {
		return Record{}, err
	}
	s.metrics.revoked.Inc()
	s.log.Warn("node revoked", "edge", node, "key", r.Key)
	return r, nil
}

// revocationSync is how often each replica checks that the resolver holds
// the registry's revocations.
const revocationSync = 5 * time.Second

// gateTimeout bounds Suspend and Resume, which take no context.
const gateTimeout = 10 * time.Second

// Suspend revokes node's credentials until Resume: the cloud suspends an
// edge whose Kubernetes Node was deleted (topology.EdgeGate).
func (s *Service) Suspend(node string) {
	s.setSuspended(node, true)
}

// Resume lifts a suspension: a kubelet that registers the Node again
// brings its edge back without re-enrollment.
func (s *Service) Resume(node string) {
	s.setSuspended(node, false)
}

func (s *Service) setSuspended(node string, on bool) {
	r, ok := s.Record(node)
	if !ok || r.Revoked || r.Suspended == on {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	var err error
	if on {
		err = s.revoker.Revoke(ctx, r.Key)
	} else {
		err = s.revoker.Unrevoke(ctx, r.Key)
	}
	if err == nil {
		r.Suspended = on
		err = s.put(ctx, r)
	}
	if err != nil {
		s.log.Error("suspend edge", "edge", node, "suspend", on, "err", err)
		return
	}
	s.log.Info("edge suspension changed", "edge", node, "suspended", on)
}

// ErrUnknownNode says the registry has no credentials of the node.
var ErrUnknownNode = errors.New("no credentials issued to node")

// requestError is an endpoint error the requester caused (code 400).
type requestError struct{ err error }

func (e requestError) Error() string { return e.err.Error() }

func badRequest(format string, a ...any) error { return requestError{fmt.Errorf(format, a...)} }

func (s *Service) endpoint(name string, h func(micro.Request) (any, error)) micro.Handler {
	return micro.HandlerFunc(func(r micro.Request) {
		out, err := h(r)
		if err != nil {
			code := "500"
			var re requestError
			if errors.As(err, &re) || errors.Is(err, ErrUnknownNode) {
				code = "400"
				s.metrics.refused.WithLabelValues(name).Inc()
			}
			s.log.Warn("identity request refused", "endpoint", name, "subject", r.Subject(), "err", err)
			_ = r.Error(code, err.Error(), nil)
			return
		}
		if a, ok := out.(afterReply); ok {
			_ = r.RespondJSON(a.reply)
			a.then()
			return
		}
		_ = r.RespondJSON(out)
	})
}

// afterReply is a reply with something to do once it is sent.
type afterReply struct {
	reply any
	then  func()
}

// RevokeRequest asks to revoke a node.
type RevokeRequest struct {
	Node string `json:"node"`
}

func (s *Service) handleRevoke(r micro.Request) (any, error) {
	var req RevokeRequest
	if err := decodeStrict(r.Data(), &req); err != nil {
		return nil, badRequest("revoke: %w", err)
	}
	if err := events.ValidName(req.Node); err != nil {
		return nil, badRequest("revoke: node: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	return s.Revoke(ctx, req.Node)
}

// TokenRequest asks for a bootstrap token of a node.
type TokenRequest struct {
	Node string        `json:"node"`
	Unit string        `json:"unit,omitempty"`
	TTL  time.Duration `json:"ttl"`
}

// TokenReply carries a bootstrap token: a NATS credentials file.
type TokenReply struct {
	Node    string    `json:"node"`
	Creds   string    `json:"creds"`
	Expires time.Time `json:"expires"`
}

func (s *Service) handleToken(r micro.Request) (any, error) {
	var req TokenRequest
	if err := decodeStrict(r.Data(), &req); err != nil {
		return nil, badRequest("token: %w", err)
	}
	if err := events.ValidName(req.Node); err != nil {
		return nil, badRequest("token: node: %w", err)
	}
	if req.Unit != "" {
		if err := events.ValidUnit(req.Unit); err != nil {
			return nil, badRequest("token: unit: %w", err)
		}
	}
	if req.TTL <= 0 || req.TTL > s.cfg.MaxTokenTTL {
		return nil, badRequest("token: ttl %v is outside (0, %v]", req.TTL, s.cfg.MaxTokenTTL)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	pub, _ := kp.PublicKey()
	tok, err := s.issuer.Bootstrap(req.Node, req.Unit, pub, req.TTL)
	if err != nil {
		return nil, err
	}
	creds, err := FormatCreds(tok, kp)
	if err != nil {
		return nil, err
	}
	s.log.Info("bootstrap token issued", "edge", req.Node, "unit", req.Unit, "ttl", req.TTL)
	return TokenReply{Node: req.Node, Creds: string(creds), Expires: time.Now().Add(req.TTL).UTC()}, nil
}

// Wire types of the enrollment endpoints (package events).
type (
	EnrollRequest = events.EnrollRequest
	EnrollReply   = events.EnrollReply
	RenewRequest  = events.RenewRequest
)

func (s *Service) handleEnroll(r micro.Request) (any, error) {
	node, err := subjectNode(r.Subject(), "")
	if err != nil {
		return nil, badRequest("enroll: %w", err)
	}
	req, err := events.DecodeEnrollRequest(r.Data())
	if err != nil {
		return nil, badRequest("%w", err)
	}
	claims, err := s.checkToken(req.Token, node)
	if err != nil {
		return nil, badRequest("enroll %s: %w", node, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	// Single use: the first enrollment with a token records its ID; the
	// bucket refuses to create the entry twice.
	rec, err := json.Marshal(spentToken{Node: node, User: claims.Subject, At: time.Now().UTC()})
	if err != nil {
		return nil, err
	}
	if _, err := s.kv.Create(ctx, tokenKeyPrefix+claims.ID, rec); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil, badRequest("enroll %s: the bootstrap token was used already", node)
		}
		return nil, fmt.Errorf("enroll %s: record the token: %w", node, err)
	}
	unit := tagValue(claims.Tags, "unit")
	if u, ok := s.assignedUnit(ctx, node); ok {
		unit = u
	}
	userJWT, err := s.IssueEdge(ctx, node, unit, req.Key)
	if err != nil {
		return nil, err
	}
	s.log.Info("node enrolled", "edge", node, "unit", unit, "key", req.Key)
	// The token is spent: its user cannot log in again. Revoked once the
	// node has its reply (the revocation closes the token's connection).
	return afterReply{reply: EnrollReply{Node: node, JWT: userJWT}, then: func() {
		s.afterGrace(func() {
			ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
			defer cancel()
			if err := s.revokeSpentToken(ctx, claims.ID); err != nil {
				s.log.Warn("revoke a spent bootstrap token", "edge", node, "err", err)
			}
		})
	}}, nil
}

// tokenKeyPrefix starts the registry's key of each spent bootstrap token
// (followed by the token's JWT ID).
const tokenKeyPrefix = "token."

// spentToken is the registry's record of a spent bootstrap token.
type spentToken struct {
	Node string    `json:"node"`
	User string    `json:"user"` // the token's user key
	At   time.Time `json:"at"`   // when it was spent
	// Revoked is set once the user's revocation is recorded.
	Revoked bool `json:"revoked,omitempty"`
}

// revokeSpentToken revokes the user of the spent token whose JWT ID is
// id and marks its record: no later sweep revokes it again.
func (s *Service) revokeSpentToken(ctx context.Context, id string) error {
	e, err := s.kv.Get(ctx, tokenKeyPrefix+id)
	if err != nil {
		return err
	}
	var rec spentToken
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.User == "" {
		return fmt.Errorf("the record of token %s is not one this version writes: %q", id, e.Value())
	}
	if rec.Revoked {
		return nil
	}
	if err := s.revoker.Revoke(ctx, rec.User); err != nil {
		return err
	}
	rec.Revoked = true
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	// A replica sweeping at the same time marks it too: same content.
	_, err = s.kv.Update(ctx, tokenKeyPrefix+id, data, e.Revision())
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil
	}
	return err
}

// sweepAtStart runs SweepSpent once the grace of a token spent just
// before this start is over, and logs what it did.
func (s *Service) sweepAtStart(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-time.After(s.cfg.SpentTokenGrace):
	}
	n, err := s.SweepSpent(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		s.log.Warn("revoking spent bootstrap tokens left unrevoked", "revoked", n, "err", err)
	case n > 0:
		s.log.Info("revoked spent bootstrap tokens a stopped replica left unrevoked", "revoked", n)
	}
}

// SweepSpent revokes the users of the spent bootstrap tokens whose
// revocation is still due after their grace (a replica died within it)
// and returns how many it revoked. Records older than this version's (the
// node's name alone) are left: their tokens expire.
func (s *Service) SweepSpent(ctx context.Context) (int, error) {
	keys, err := s.kv.ListKeysFiltered(ctx, tokenKeyPrefix+">")
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for k := range keys.Keys() {
		e, err := s.kv.Get(ctx, k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var rec spentToken
		if json.Unmarshal(e.Value(), &rec) != nil || rec.User == "" || rec.Revoked || time.Since(rec.At) < s.cfg.SpentTokenGrace {
			continue
		}
		if err := s.revokeSpentToken(ctx, strings.TrimPrefix(k, tokenKeyPrefix)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// afterGrace runs revoke spentTokenGrace from now, or at Stop if that
// comes first.
func (s *Service) afterGrace(revoke func()) {
	s.spentMu.Lock()
	defer s.spentMu.Unlock()
	if s.spent == nil {
		s.spent = map[*time.Timer]func(){}
	}
	var t *time.Timer
	t = time.AfterFunc(s.cfg.SpentTokenGrace, func() {
		s.spentMu.Lock()
		_, pending := s.spent[t]
		delete(s.spent, t)
		s.spentMu.Unlock()
		if pending {
			revoke()
		}
	})
	s.spent[t] = revoke
}

// revokeSpent runs the waiting revocations of spent tokens now.
func (s *Service) revokeSpent() {
	s.spentMu.Lock()
	var now []func()
	for t, revoke := range s.spent {
		if t.Stop() {
			now = append(now, revoke)
		}
		delete(s.spent, t)
	}
	s.spentMu.Unlock()
	for _, revoke := range now {
		revoke()
	}
}

// checkToken verifies a bootstrap token: signed by the account's signing
// key, a bootstrap token, for node, not expired.
func (s *Service) checkToken(token, node string) (*jwt.UserClaims, error) {
	claims, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	vr := jwt.CreateValidationResults()
	claims.Validate(vr)
	switch {
	case claims.Issuer != pubOf(s.issuer.Keys().AccountSigning) || claims.IssuerAccount != s.issuer.Keys().AccountKey():
		return nil, errors.New("token: not issued by this installation")
	case !claims.Tags.Contains("role:" + string(RoleBootstrap)):
		return nil, errors.New("token: not a bootstrap token")
	case !claims.Tags.Contains("name:" + strings.ToLower(node)):
		return nil, errors.New("token: issued for another node")
	case claims.Expires == 0 || time.Unix(claims.Expires, 0).Before(time.Now()):
		return nil, errors.New("token: expired")
	case vr.IsBlocking(true):
		return nil, fmt.Errorf("token: %v", vr.Errors())
	}
	return claims, nil
}

func (s *Service) handleRenew(r micro.Request) (any, error) {
	node, err := subjectNode(r.Subject(), ".renew")
	if err != nil {
		return nil, badRequest("renew: %w", err)
	}
	var req RenewRequest
	if err := decodeStrict(r.Data(), &req); err != nil {
		return nil, badRequest("renew: %w", err)
	}
	rec, ok := s.Record(node)
	if !ok {
		return s.reregister(node, req.Key)
	}
	switch {
	case rec.Revoked || rec.Suspended:
		return nil, badRequest("renew %s: the node's credentials are revoked", node)
	case rec.Key != req.Key:
		return nil, badRequest("renew %s: not the node's key", node)
	}
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	// The credentials follow the node's unit: a node moved to another
	// unit renews to hear it.
	unit := rec.Unit
	if u, ok := s.assignedUnit(ctx, node); ok {
		unit = u
	}
	userJWT, err := s.IssueEdge(ctx, node, unit, rec.Key)
	if err != nil {
		return nil, err
	}
	s.metrics.renewed.Inc()
	return EnrollReply{Node: node, JWT: userJWT}, nil
}

// reregister answers the renewal of a node the registry does not know,
// whose credentials the hub still accepts: the registry was lost (a new
// hub volume, a deleted bucket). Only node's own credentials can ask on
// its renew subject, so its key is recorded again, unless the account
// revokes it, and its credentials renewed; without that, its unit view
// carries no key for it and its peers drop its reports until its
// credentials expire. A node the topology does not assign (its Node
// deleted, or never a member) is refused as before.
func (s *Service) reregister(node, key string) (any, error) {
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	unit, assigned := s.assignedUnit(ctx, node)
	if !assigned {
		return nil, fmt.Errorf("renew: %w: %s", ErrUnknownNode, node)
	}
	if !nkeys.IsValidPublicUserKey(key) {
		return nil, badRequest("renew %s: %q is not a user key", node, key)
	}
	if s.revoker != nil {
		revoked, err := s.revoker.Revoked(ctx, key, time.Now())
		if err != nil {
			return nil, err
		}
		if revoked {
			return nil, badRequest("renew %s: the node's credentials are revoked", node)
		}
	}
	userJWT, err := s.IssueEdge(ctx, node, unit, key)
	if err != nil {
		return nil, err
	}
	s.metrics.reregistered.Inc()
	s.log.Warn("identity registry: a node it did not know renewed its credentials; key recorded again (was the registry lost?)", "node", node, "unit", unit, "key", key)
	return EnrollReply{Node: node, JWT: userJWT}, nil
}

// assignedUnit is the unit of node's last NodeAssignment on the VIEWS
// stream (what the topology service decided), if there is one.
func (s *Service) assignedUnit(ctx context.Context, node string) (string, bool) {
	subj, err := events.AssignmentSubject(node)
	if err != nil {
		return "", false
	}
	st, err := s.js.Stream(ctx, events.StreamViews)
	if err != nil {
		return "", false
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return "", false
	}
	var a atollv1.NodeAssignment
	if err := events.DecodeMsg(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}, &a); err != nil {
		s.log.Warn("undecodable assignment", "edge", node, "err", err)
		return "", false
	}
	return a.GetUnit(), true
}

// subjectNode is the node of an enrollment subject atoll.enroll.<node><suffix>.
func subjectNode(subject, suffix string) (string, error) {
	tok, ok := strings.CutPrefix(subject, EnrollPrefix)
	if !ok {
		return "", fmt.Errorf("subject %q is no enrollment subject", subject)
	}
	if tok, ok = strings.CutSuffix(tok, suffix); !ok || tok == "" || strings.Contains(tok, ".") {
		return "", fmt.Errorf("subject %q is no enrollment subject", subject)
	}
	node := events.Name(tok)
	if err := events.ValidName(node); err != nil {
		return "", err
	}
	return node, nil
}

func tagValue(tags jwt.TagList, key string) string {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, key+":"); ok {
			return v
		}
	}
	return ""
}

// decodeStrict decodes one JSON request object.
func decodeStrict(data []byte, v any) error { return events.DecodeJSON(data, 64<<10, v) }

// Metrics of the identity service.
type Metrics struct {
	issued, revoked, renewed, reregistered prometheus.Counter
	refused, violations                    *prometheus.CounterVec
}

// NewMetrics registers the metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		issued:  prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "edge_credentials_issued_total", Help: "Edge credentials issued (enrollments and renewals)."}),
		revoked: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "nodes_revoked_total", Help: "Nodes revoked."}),
		renewed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "edge_credentials_renewed_total", Help: "Edge credentials renewed."}),
		reregistered: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "nodes_reregistered_total",
			Help: "Nodes the registry did not know that renewed valid credentials, whose keys were recorded again (a lost registry)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "requests_refused_total", Help: "Identity requests refused as malformed or not allowed, by endpoint."}, []string{"endpoint"}),
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "identity", Name: "violations_total",
			Help: "Connections a hub server cut off for sending what their credentials do not allow (a tampered or misconfigured edge server), by the role and name their credentials give: only those that did have a series."}, []string{"role", "node"}),
	}
	if reg != nil {
		reg.MustRegister(m.issued, m.revoked, m.renewed, m.reregistered, m.refused, m.violations)
	}
	return m
}
