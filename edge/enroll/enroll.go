// Package enroll gets the edge node its hub credentials and keeps them
// fresh. A node that starts with a one-time bootstrap token (atoll-edge
// --bootstrap-token-file, from `atoll node enroll` or a Kubernetes Secret)
// links to the hub with it, generates its own nkey (the seed never leaves
// the node), and asks atoll-cloud over its own leaf link for a user JWT
// of that key; the credentials then replace the token (natsnode writes
// them to its creds file). Before the credentials expire, the node asks
// for fresh ones with its current ones and its leaf reconnects with them.
package enroll

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// requestTimeout bounds one enrollment or renewal request.
const requestTimeout = 10 * time.Second

// request sends req to subject and decodes the identity service's reply;
// with inbox set, the reply comes to a subject under it rather than the
// connection's inbox.
func request(ctx context.Context, nc *nats.Conn, subject, inbox string, req any) (events.EnrollReply, error) {
	var rep events.EnrollReply
	data, err := json.Marshal(req)
	if err != nil {
		return rep, err
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var msg *nats.Msg
	if inbox == "" {
		msg, err = nc.RequestWithContext(ctx, subject, data)
	} else {
		msg, err = requestVia(ctx, nc, subject, inbox+"."+nats.NewInbox()[len(nats.InboxPrefix):], data)
	}
	if err != nil {
		return rep, fmt.Errorf("request %s: %w", subject, err)
	}
	if desc := msg.Header.Get(micro.ErrorHeader); desc != "" {
		return rep, fmt.Errorf("%w: %s", ErrRefused, desc)
	}
	if err := events.DecodeJSON(msg.Data, 64<<10, &rep); err != nil {
		return rep, fmt.Errorf("reply on %s: %w", subject, err)
	}
	if rep.JWT == "" {
		return rep, fmt.Errorf("reply on %s: no JWT", subject)
	}
	return rep, nil
}

// requestVia sends data to subject with reply subject reply, which it
// listens on first, and waits for the reply.
func requestVia(ctx context.Context, nc *nats.Conn, subject, reply string, data []byte) (*nats.Msg, error) {
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: data}); err != nil {
		return nil, err
	}
	return sub.NextMsgWithContext(ctx)
}

// ErrRefused says atoll-cloud refused the request (a spent, expired or wrong
// token; a revoked node); retrying does not help.
var ErrRefused = errors.New("atoll-cloud refused")

// Bootstrap exchanges the bootstrap token (the user JWT nc is logged in
// with, directly or through the node's leaf link) for node's credentials:
// it generates the node's nkey and returns it with its user JWT.
func Bootstrap(ctx context.Context, nc *nats.Conn, node, token string) (string, nkeys.KeyPair, error) {
	subj, err := events.EnrollSubject(node)
	if err != nil {
		return "", nil, err
	}
	return exchange(ctx, nc, node, subj, "", token)
}

// EnrollByServiceAccount exchanges the ServiceAccount token of the node's
// atoll-edge pod for node's credentials, over nc linked with the shared
// enrollment credentials: it generates the node's nkey and returns it
// with its user JWT.
func EnrollByServiceAccount(ctx context.Context, nc *nats.Conn, node, saToken string) (string, nkeys.KeyPair, error) {
	subj, err := events.EnrollKubernetesSubject(node)
	if err != nil {
		return "", nil, err
	}
	return exchange(ctx, nc, node, subj, events.EnrollInboxPrefix(node), saToken)
}

// exchange generates node's nkey and sends its public key with token to
// subject (the reply under inbox, when set); it returns the issued JWT,
// checked to be for that key, and the key.
func exchange(ctx context.Context, nc *nats.Conn, node, subject, inbox, token string) (string, nkeys.KeyPair, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	pub, _ := kp.PublicKey()
	rep, err := request(ctx, nc, subject, inbox, events.EnrollRequest{Token: token, Key: pub})
	if err == nil {
		err = checkJWT(rep.JWT, pub)
	}
	if err != nil {
		return "", nil, fmt.Errorf("enroll %s: %w", node, err)
	}
	return rep.JWT, kp, nil
}

// Renew asks for fresh credentials of node's key pub, over nc logged in
// with the current ones.
func Renew(ctx context.Context, nc *nats.Conn, node, pub string) (string, error) {
	subj, err := events.RenewSubject(node)
	if err != nil {
		return "", err
	}
	rep, err := request(ctx, nc, subj, "", events.RenewRequest{Key: pub})
	if err != nil {
		return "", fmt.Errorf("renew %s: %w", node, err)
	}
	if err := checkJWT(rep.JWT, pub); err != nil {
		return "", fmt.Errorf("renew %s: %w", node, err)
	}
	return rep.JWT, nil
}

func checkJWT(userJWT, pub string) error {
	c, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return fmt.Errorf("the issued JWT: %w", err)
	}
	if c.Subject != pub {
		return errors.New("the issued JWT is for another key")
	}
	return nil
}

// Config tunes the Enroller.
type Config struct {
	// Check is how often the credentials' expiry is looked at, and the
	// pause between failed attempts.
	Check time.Duration
	// RenewAt is the fraction of the credentials' lifetime after which
	// they are renewed.
	RenewAt float64
	// ServiceAccountTokenFile is the pod's projected ServiceAccount token
	// the node enrolls with while it links with the shared enrollment
	// credentials (read at each attempt: the kubelet renews it).
	ServiceAccountTokenFile string
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config { return Config{Check: time.Minute, RenewAt: 2.0 / 3} }

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Check <= 0:
		return fmt.Errorf("enroll: check interval %v must be positive", c.Check)
	case c.RenewAt <= 0 || c.RenewAt >= 1:
		return fmt.Errorf("enroll: renew-at %v must be within (0, 1)", c.RenewAt)
	}
	return nil
}

// due reports whether credentials c need renewing: past RenewAt of their
// lifetime, scoped to another unit than the node's, or not the key the
// node's unit view lists for it.
func (e *Enroller) due(c *jwt.UserClaims) bool {
	return e.expiring(c) || e.unitDue(c) || e.keyDue(c)
}

// keyDue: the node's unit view has listed it without the key of
// credentials c, or with another, for longer than the node's keyWait
// (asked again at most every keyRenewPause). The cloud has lost its
// registry: a renewal records the key again, and until then the node's
// peers drop its reports. keyWait, random below keyRenewPause, spreads
// the nodes of a fleet that all saw their keys go at once, and lets the
// cloud publish a key it has just recorded.
func (e *Enroller) keyDue(c *jwt.UserClaims) bool {
	if e.listedKey == nil {
		return false
	}
	if key, listed := e.listedKey(); !listed || key == c.Subject {
		e.keyMissing = time.Time{}
		return false
	}
	if e.keyMissing.IsZero() {
		e.keyMissing = time.Now()
	}
	return time.Since(e.keyMissing) >= e.keyWait && time.Since(e.lastRenew) >= keyRenewPause
}

// expiring: past RenewAt of the credentials' lifetime.
func (e *Enroller) expiring(c *jwt.UserClaims) bool {
	if c.Expires == 0 {
		return false
	}
	life := time.Duration(c.Expires-c.IssuedAt) * time.Second
	return !time.Now().Before(time.Unix(c.IssuedAt, 0).Add(time.Duration(e.cfg.RenewAt * float64(life))))
}

// unitDue: the credentials are scoped to another unit than the node's
// assignment (asked again at most every unitRenewPause).
func (e *Enroller) unitDue(c *jwt.UserClaims) bool {
	if e.unit == nil || time.Since(e.lastRenew) < unitRenewPause {
		return false
	}
	want, ok := e.unit()
	return ok && strings.ToLower(want) != unitOf(c)
}

// unitOf is the unit tag of credentials ("" for none).
func unitOf(c *jwt.UserClaims) string {
	for _, t := range c.Tags {
		if v, ok := strings.CutPrefix(t, "unit:"); ok {
			return v
		}
	}
	return ""
}

// bootstrapRetry is the pause between enrollment attempts.
const bootstrapRetry = 2 * time.Second

// Enroller enrolls the node when it runs on a bootstrap token and renews
// its credentials before they expire.
type Enroller struct {
	cfg  Config
	node *natsnode.Node
	link *hublink.Link
	log  *slog.Logger
	// unit is the node's assigned unit and whether it has an assignment;
	// nil: not followed.
	unit func() (string, bool)
	// listedKey is the key the node's unit view lists for it and whether
	// it lists the node; nil: not followed.
	listedKey  func() (string, bool)
	keyMissing time.Time     // since when the view lists no key, or another
	keyWait    time.Duration // how long keyMissing lasts before a renewal
	lastRenew  time.Time
}

// keyRenewPause spaces renewals driven by a unit view that lists no key,
// or another, for the node: the cloud publishes the view again once it
// has recorded the key.
const keyRenewPause = 30 * time.Second

// FollowListedKey makes the enroller renew the credentials when the
// node's unit view lists another key for it, or none: the key is then
// recorded again in the cloud's registry.
func (e *Enroller) FollowListedKey(key func() (string, bool)) { e.listedKey = key }

// unitRenewPause spaces renewals driven by a unit change, for a cloud that
// has not published the new assignment yet.
const unitRenewPause = 10 * time.Second

// FollowUnit makes the enroller renew the credentials as soon as the
// node's assigned unit differs from the unit they are scoped to: a node
// moved to another unit hears its new unit once renewed.
func (e *Enroller) FollowUnit(unit func() (string, bool)) { e.unit = unit }

// New returns the enroller of node; link is the agent's connection to the
// node's own server.
func New(cfg Config, node *natsnode.Node, link *hublink.Link, log *slog.Logger) (*Enroller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Enroller{cfg: cfg, node: node, link: link, log: log.With("component", "enroll"),
		keyWait: rand.N(keyRenewPause)}, nil
}

// Run enrolls (when bootstrapping) and renews until ctx is done.
func (e *Enroller) Run(ctx context.Context) error {
	for {
		// Checks are local and cheap: look often, so that enrollment and
		// a unit change are quick; after a refusal, wait Check.
		wait := min(e.cfg.Check, bootstrapRetry)
		if err := e.step(ctx); err != nil && ctx.Err() == nil {
			if errors.Is(err, ErrRefused) {
				wait = e.cfg.Check
			}
			if _, ok := e.node.Bootstrapping(); ok || e.node.EnrollingByServiceAccount() {
				e.log.Warn("not enrolled yet; retrying", "err", err, "in", wait)
			} else {
				e.log.Warn("credentials not renewed; retrying", "err", err, "in", wait)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// step enrolls or renews once if due.
func (e *Enroller) step(ctx context.Context) error {
	nc := e.link.Conn()
	if nc == nil {
		return errors.New("no connection to the node's server")
	}
	name := e.node.Name()
	if e.node.EnrollingByServiceAccount() {
		if e.cfg.ServiceAccountTokenFile == "" {
			return fmt.Errorf("%w: the node links with the enrollment credentials but has no ServiceAccount token file", ErrRefused)
		}
		token, err := os.ReadFile(e.cfg.ServiceAccountTokenFile)
		if err != nil {
			return fmt.Errorf("ServiceAccount token: %w", err)
		}
		userJWT, kp, err := EnrollByServiceAccount(ctx, nc, name, strings.TrimSpace(string(token)))
		if err != nil {
			return err
		}
		if err := e.node.SetCredentials(userJWT, kp); err != nil {
			return err
		}
		e.log.Info("enrolled with the pod's ServiceAccount token", "key", e.node.PublicKey())
		return nil
	}
	if token, ok := e.node.Bootstrapping(); ok {
		userJWT, kp, err := Bootstrap(ctx, nc, name, token)
		if err != nil {
			return err
		}
		if err := e.node.SetCredentials(userJWT, kp); err != nil {
			return err
		}
		e.log.Info("enrolled with the bootstrap token", "key", e.node.PublicKey())
		return nil
	}
	cur := e.node.UserJWT()
	if cur == "" {
		return nil // a bare nkey: nothing to renew
	}
	c, err := jwt.DecodeUserClaims(cur)
	if err != nil {
		return err
	}
	if !e.due(c) {
		return nil
	}
	expiring, keyed := e.expiring(c), !e.keyMissing.IsZero()
	e.lastRenew = time.Now()
	fresh, err := Renew(ctx, nc, name, e.node.PublicKey())
	if err != nil {
		return err
	}
	if fc, err := jwt.DecodeUserClaims(fresh); err == nil && !expiring && unitOf(fc) == unitOf(c) {
		// The cloud does not see the unit change yet (or sees another
		// one), or renewed to record the key again: keep the link as it
		// is rather than bounce it for the same permissions.
		if keyed {
			e.log.Info("credentials renewed: the cloud records the node's key again")
		}
		return nil
	}
	if err := e.node.SetUserJWT(fresh); err != nil {
		return err
	}
	e.log.Info("credentials renewed")
	return nil
}
