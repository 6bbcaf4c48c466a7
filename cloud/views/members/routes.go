package members

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// Route credentials. Every unit has its own route password, kept in the
// secrets bucket (key: the unit) together with the members it was handed
// to. It goes only into the assignments of the unit's current members,
// never into a view. When a member leaves the unit (its Node is deleted
// or relabelled, or it stops reporting), the next pass rotates the
// password: the remaining members get the new one in their assignments
// and reload their routes (edge/natsnode), and the departed node, still
// holding the old one, is refused when it routes in. The same check runs
// before a password is handed to a new member, so a unit that emptied and
// is joined again never reuses a password a former member knows.
//
// Replicas share the bucket: a rotation is a compare-and-set on the
// entry's revision, so concurrent replicas agree on one password, and a
// watch keeps each replica's copy current. A replica whose view of the
// unit lags (it still counts the departed node) may record the node as a
// member again; as soon as its view catches up, the node is a departure
// once more and the password rotates again.

// routeSecret is a unit's entry in the secrets bucket.
type routeSecret struct {
	Password string `json:"password"`
	// Members are the nodes that may hold Password: the unit's members
	// since it was issued, sorted.
	Members []string `json:"members"`
}

// cachedSecret is a unit's entry as last read or written, with its
// revision for compare-and-set.
type cachedSecret struct {
	routeSecret
	rev uint64
}

// routeUser is the route user name of unit's servers.
func routeUser(unit string) string { return "unit-" + unit }

// maxSecretAttempts bounds the compare-and-set retries of one pass.
const maxSecretAttempts = 5

// secret returns unit's route password for a unit of members (sorted):
// the stored one, recorded for members that joined, or a new one when a
// node that held it is no longer a member (or the entry is missing or
// does not decode).
func (s *Service) secret(ctx context.Context, unit string, members []string) (string, error) {
	for range maxSecretAttempts {
		cur, found, err := s.loadSecret(ctx, unit)
		if err != nil {
			return "", err
		}
		departed := found && cur.Password != "" && !subset(cur.Members, members)
		next := cur
		switch {
		case !found || cur.Password == "" || departed:
			pw, err := newPassword()
			if err != nil {
				return "", err
			}
			next.routeSecret = routeSecret{Password: pw, Members: members}
		case !subset(members, cur.Members):
			next.Members = union(cur.Members, members)
		default:
			return cur.Password, nil
		}
		value, err := json.Marshal(next.routeSecret)
		if err != nil {
			return "", fmt.Errorf("members: route secret of %s: %w", unit, err)
		}
		var rev uint64
		if found {
			rev, err = s.kv.Update(ctx, unit, value, cur.rev)
		} else {
			rev, err = s.kv.Create(ctx, unit, value)
		}
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				// Another replica wrote first: read its entry and judge
				// again.
				s.dropSecret(unit)
				continue
			}
			return "", fmt.Errorf("members: route secret of %s: %w", unit, err)
		}
		next.rev = rev
		s.storeSecret(unit, next)
		if found && next.Password != cur.Password {
			gone := difference(cur.Members, members)
			s.metrics.rotations.Inc()
			if cur.Password != "" && len(gone) > 0 {
				s.log.Info("route credentials of the unit rotated: members left", "unit", unit, "departed", gone, "members", len(members))
			} else {
				s.log.Warn("route credentials of the unit rotated: the stored entry did not decode", "unit", unit)
			}
		}
		return next.Password, nil
	}
	return "", fmt.Errorf("members: route secret of %s: %d concurrent updates in a row", unit, maxSecretAttempts)
}

// loadSecret returns unit's entry from the cache, or the bucket. An entry
// that does not decode is returned found with no password, to be replaced.
func (s *Service) loadSecret(ctx context.Context, unit string) (cachedSecret, bool, error) {
	s.mu.Lock()
	cur, ok := s.secrets[unit]
	s.mu.Unlock()
	if ok {
		return cur, true, nil
	}
	e, err := s.kv.Get(ctx, unit)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return cachedSecret{}, false, nil
	}
	if err != nil {
		return cachedSecret{}, false, fmt.Errorf("members: route secret of %s: %w", unit, err)
	}
	cur = decodeSecret(e.Value(), e.Revision())
	s.storeSecret(unit, cur)
	return cur, true, nil
}

func decodeSecret(value []byte, rev uint64) cachedSecret {
	var rs routeSecret
	if err := json.Unmarshal(value, &rs); err != nil {
		rs = routeSecret{} // an older plain password: replaced
	}
	return cachedSecret{routeSecret: rs, rev: rev}
}

func (s *Service) storeSecret(unit string, c cachedSecret) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.secrets[unit]; ok && old.rev > c.rev {
		return // the watch brought a newer one
	}
	s.secrets[unit] = c
}

func (s *Service) dropSecret(unit string) {
	s.mu.Lock()
	delete(s.secrets, unit)
	s.mu.Unlock()
}

// watchSecrets keeps the cached entries current with what other replicas
// write, and republishes the assignments when an entry changes, until ctx
// is done.
func (s *Service) watchSecrets(ctx context.Context) {
	w, err := s.kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		s.log.Warn("cannot watch route secrets; each replica keeps its own copy until it writes", "err", err)
		return
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.dropSecret(e.Key())
			} else {
				s.storeSecret(e.Key(), decodeSecret(e.Value(), e.Revision()))
			}
			s.poke()
		}
	}
}

func newPassword() (string, error) {
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", fmt.Errorf("members: route password: %w", err)
	}
	return hex.EncodeToString(raw[:]), nil
}

// subset reports whether every element of a is in b (both sorted).
func subset(a, b []string) bool {
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			return false
		}
	}
	return true
}

// union of two sorted lists, sorted.
func union(a, b []string) []string {
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

// difference is a without the elements of b (both sorted).
func difference(a, b []string) []string {
	var out []string
	for _, x := range a {
		if _, ok := slices.BinarySearch(b, x); !ok {
			out = append(out, x)
		}
	}
	return out
}
