package identity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Revoker changes the application account's revocation list: it reads the
// account JWT the servers' resolver holds, re-signs it with the operator
// signing key and pushes it through the system account, so every server
// of the hub (embedded or external) closes the revoked users' connections
// at once and refuses them afterwards.
type Revoker struct {
	keys *Keys
	sys  *nats.Conn         // a system account user's connection
	kv   jetstream.KeyValue // the registry (UseRegistry); nil: none
	mu   sync.Mutex         // one update of the account JWT at a time
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
	at := r.now().Unix()
	return r.update(ctx, func(l jwt.RevocationList) { l[pub] = max(l[pub], at) })
}

// Unrevoke lifts the revocation of pub.
func (r *Revoker) Unrevoke(ctx context.Context, pub string) error {
	return r.update(ctx, func(l jwt.RevocationList) { delete(l, pub) })
}

// Revoked reports whether the account revokes pub's JWTs issued at t.
func (r *Revoker) Revoked(ctx context.Context, pub string, t time.Time) (bool, error) {
	ac, err := r.AccountJWT(ctx)
	if err != nil {
		return false, err
	}
	return ac.Revocations.IsRevoked(pub, t), nil
}

// revocationsKey is the registry entry that holds the revocation list.
const revocationsKey = "revocations"

// UseRegistry makes kv's revocation list the source of truth: every
// replica of atoll-cloud changes it with compare-and-set and pushes it to
// the resolver (Sync), so concurrent revocations by two replicas cannot
// overwrite each other. Without a registry the revoker changes the
// resolver's account JWT directly (one writer).
func (r *Revoker) UseRegistry(kv jetstream.KeyValue) { r.kv = kv }

// update applies change to the revocation list and pushes it.
func (r *Revoker) update(ctx context.Context, change func(jwt.RevocationList)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv == nil {
		ac, err := r.AccountJWT(ctx)
		if err != nil {
			return err
		}
		if ac.Revocations == nil {
			ac.Revocations = jwt.RevocationList{}
		}
		change(ac.Revocations)
		return r.push(ctx, ac)
	}
	var written uint64
	for attempt := 0; ; attempt++ {
		var err error
		written, err = r.casOnce(ctx, change)
		if err == nil {
			break
		}
		if attempt == casAttempts {
			return fmt.Errorf("identity: record revocations: %w", err)
		}
		// A conflict (another replica changed the list; a replica's
		// read may lag) or a transient error (a bucket electing its
		// leader): try again after a short random pause.
		pause := time.Duration(rand.Int64N(int64(retryPause)))
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			pause = retryPause
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("identity: record revocations: %w", err)
		case <-time.After(pause):
		}
	}
	return r.syncLocked(ctx, written)
}

// retryPause separates attempts after a transient error, and bounds the
// random pause after a conflict; casAttempts bounds the attempts.
const (
	retryPause  = 200 * time.Millisecond
	casAttempts = 30
)

// casOnce applies change to the registry's list with compare-and-set and
// returns the revision it wrote.
func (r *Revoker) casOnce(ctx context.Context, change func(jwt.RevocationList)) (uint64, error) {
	list, rev, err := r.registered(ctx)
	if err != nil {
		return 0, err
	}
	change(list)
	data, err := json.Marshal(list)
	if err != nil {
		return 0, err
	}
	if rev == 0 {
		return r.kv.Create(ctx, revocationsKey, data)
	}
	return r.kv.Update(ctx, revocationsKey, data, rev)
}

// registered reads the registry's revocation list and its revision (0:
// none yet; then the resolver's list is the start).
func (r *Revoker) registered(ctx context.Context) (jwt.RevocationList, uint64, error) {
	e, err := r.kv.Get(ctx, revocationsKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		ac, err := r.AccountJWT(ctx)
		if err != nil {
			return nil, 0, err
		}
		list := jwt.RevocationList{}
		for k, v := range ac.Revocations {
			list[k] = v
		}
		return list, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("identity: read revocations: %w", err)
	}
	list := jwt.RevocationList{}
	if err := json.Unmarshal(e.Value(), &list); err != nil {
		return nil, 0, fmt.Errorf("identity: revocations entry: %w", err)
	}
	return list, e.Revision(), nil
}

// Sync pushes the registry's revocation list to the resolver when the
// account JWT there differs. Every replica syncs after each change and
// periodically, so the last push always carries the newest list.
func (r *Revoker) Sync(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncLocked(ctx, 0)
}

// syncLocked pushes the registry's list, read at revision written or
// later: a replica of the bucket may answer a read from behind the
// write this revoker just made.
func (r *Revoker) syncLocked(ctx context.Context, written uint64) error {
	if r.kv == nil {
		return nil
	}
	var err error
	for range updateAttempts {
		var done bool
		if done, err = r.syncOnce(ctx, written); done && err == nil {
			return nil
		}
		if err != nil {
			// Transient (no responders while a server or the bucket
			// elects a leader): try again soon.
			select {
			case <-ctx.Done():
				return err
			case <-time.After(retryPause):
			}
		}
	}
	return err
}

// syncOnce pushes the registry's list if the resolver's differs; done
// when the resolver holds the list as it still is.
func (r *Revoker) syncOnce(ctx context.Context, written uint64) (done bool, err error) {
	list, rev, err := r.registered(ctx)
	switch {
	case err != nil:
		return false, err
	case rev < written:
		return false, fmt.Errorf("identity: the registry answered revision %d of the revocations, older than %d just written", rev, written)
	case rev == 0:
		return true, nil
	}
	ac, err := r.AccountJWT(ctx)
	if err != nil {
		return false, err
	}
	if maps.Equal(ac.Revocations, list) {
		return true, nil
	}
	ac.Revocations = list
	if err := r.push(ctx, ac); err != nil {
		return false, err
	}
	// Pushed: done unless the list changed meanwhile.
	_, now, err := r.registered(ctx)
	return err == nil && now == rev, err
}

// updateAttempts bounds the compare-and-set and sync rounds.
const updateAttempts = 5

// push signs ac with the operator signing key and sends it to the
// resolver of every server.
func (r *Revoker) push(ctx context.Context, ac *jwt.AccountClaims) error {
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
