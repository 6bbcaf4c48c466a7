package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// Revoker changes the application account's revocation list: it reads the
// account JWT the servers' resolver holds, re-signs it with the operator
// signing key and pushes it through the system account, so every server
// of the hub (embedded or external) closes the revoked users' connections
// at once and refuses them afterwards.
type Revoker struct {
	keys *Keys
	sys  *nats.Conn // a system account user's connection
	mu   sync.Mutex // one read-modify-write of the account JWT at a time
	now  func() time.Time
}

// NewRevoker returns a revoker that talks to the servers over sys, a
// connection of a system account user (Issuer.System).
func NewRevoker(k *Keys, sys *nats.Conn) *Revoker {
	return &Revoker{keys: k, sys: sys, now: time.Now}
}

const resolverTimeout = 5 * time.Second

// AccountJWT is the application account's JWT as the resolver holds it.
func (r *Revoker) AccountJWT(ctx context.Context) (*jwt.AccountClaims, error) {
	ctx, cancel := context.WithTimeout(ctx, resolverTimeout)
	defer cancel()
	msg, err := r.sys.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+r.keys.AccountKey()+".CLAIMS.LOOKUP", nil)
	if err != nil {
		return nil, fmt.Errorf("identity: look up the account JWT: %w", err)
	}
	ac, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		return nil, fmt.Errorf("identity: the resolver's account JWT: %w", err)
	}
	return ac, nil
}

// Revoke revokes every JWT of the user key pub issued until now.
func (r *Revoker) Revoke(ctx context.Context, pub string) error {
	return r.update(ctx, func(ac *jwt.AccountClaims) { ac.RevokeAt(pub, r.now()) })
}

// Unrevoke lifts the revocation of pub.
func (r *Revoker) Unrevoke(ctx context.Context, pub string) error {
	return r.update(ctx, func(ac *jwt.AccountClaims) { ac.ClearRevocation(pub) })
}

// Revoked reports whether the account revokes pub's JWTs issued at t.
func (r *Revoker) Revoked(ctx context.Context, pub string, t time.Time) (bool, error) {
	ac, err := r.AccountJWT(ctx)
	if err != nil {
		return false, err
	}
	return ac.Revocations.IsRevoked(pub, t), nil
}

func (r *Revoker) update(ctx context.Context, change func(*jwt.AccountClaims)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	ac, err := r.AccountJWT(ctx)
	if err != nil {
		return err
	}
	change(ac)
	signed, err := ac.Encode(r.keys.OperatorSigning)
	if err != nil {
		return fmt.Errorf("identity: sign the account JWT: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, resolverTimeout)
	defer cancel()
	msg, err := r.sys.RequestWithContext(ctx, "$SYS.REQ.CLAIMS.UPDATE", []byte(signed))
	if err != nil {
		return fmt.Errorf("identity: push the account JWT: %w", err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("identity: push the account JWT: reply %q: %w", msg.Data, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("identity: push the account JWT: %w", errors.New(resp.Error.Description))
	}
	return nil
}
