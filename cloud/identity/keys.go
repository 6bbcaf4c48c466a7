// Package identity is Atoll's NATS identity: decentralized JWT
// authentication with one operator, a system account (SYS) and the
// application account (ATOLL). atoll-cloud holds the keys (Keys): it signs
// the account JWTs the hub servers trust (Trust), issues user JWTs that
// carry each identity's subject permissions (Issuer), revokes users in the
// account JWT pushed to the servers' resolver (Revoker), and enrolls edge
// nodes with one-time bootstrap tokens (Service).
//
// The servers (embedded in atoll-cloud, or any external NATS cluster) run
// in operator mode with a full resolver: they verify every connection's
// JWT chain themselves and enforce its permissions, so edges keep
// connecting while atoll-cloud is down.
package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// Names of the accounts.
const (
	OperatorName  = "atoll"
	SystemAccount = "SYS"
	AppAccount    = "ATOLL"
)

// Keys are the signing keys of an Atoll installation.
type Keys struct {
	// Operator is the operator's identity key: it signs the operator JWT
	// only (the servers trust that JWT). Once trust.json exists it can be
	// removed from keys.json and kept offline (nil then).
	Operator nkeys.KeyPair
	// OperatorSigning signs the account JWTs (revocations re-sign the
	// application account).
	OperatorSigning nkeys.KeyPair
	// System is the system account's identity key; it signs the users
	// atoll-cloud pushes account updates with.
	System nkeys.KeyPair
	// Account is the application account's identity key.
	Account nkeys.KeyPair
	// AccountSigning signs every user JWT of the application account.
	AccountSigning nkeys.KeyPair
}

// keysFile is the on-disk form of Keys: nkey seeds.
type keysFile struct {
	Operator        string `json:"operator,omitempty"`
	OperatorSigning string `json:"operator_signing"`
	System          string `json:"system"`
	Account         string `json:"account"`
	AccountSigning  string `json:"account_signing"`
}

// KeysFileName is the file in an identity directory that holds the seeds.
const KeysFileName = "keys.json"

// GenerateKeys makes a fresh set of keys.
func GenerateKeys() (*Keys, error) {
	var k Keys
	var err error
	for _, g := range []struct {
		dst *nkeys.KeyPair
		mk  func() (nkeys.KeyPair, error)
	}{
		{&k.Operator, nkeys.CreateOperator}, {&k.OperatorSigning, nkeys.CreateOperator},
		{&k.System, nkeys.CreateAccount}, {&k.Account, nkeys.CreateAccount}, {&k.AccountSigning, nkeys.CreateAccount},
	} {
		if *g.dst, err = g.mk(); err != nil {
			return nil, fmt.Errorf("identity: generate keys: %w", err)
		}
	}
	return &k, nil
}

// LoadKeys reads the keys of dir.
func LoadKeys(dir string) (*Keys, error) {
	path := filepath.Join(dir, KeysFileName)
	data, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, fmt.Errorf("identity keys: %w", err)
	}
	var f keysFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("identity keys %s: %w", path, err)
	}
	var k Keys
	for _, s := range []struct {
		name   string
		seed   string
		dst    *nkeys.KeyPair
		prefix nkeys.PrefixByte
	}{
		{"operator", f.Operator, &k.Operator, nkeys.PrefixByteOperator},
		{"operator_signing", f.OperatorSigning, &k.OperatorSigning, nkeys.PrefixByteOperator},
		{"system", f.System, &k.System, nkeys.PrefixByteAccount},
		{"account", f.Account, &k.Account, nkeys.PrefixByteAccount},
		{"account_signing", f.AccountSigning, &k.AccountSigning, nkeys.PrefixByteAccount},
	} {
		if s.name == "operator" && s.seed == "" {
			continue // kept offline: needed only to sign the trust once
		}
		kp, err := nkeys.FromSeed([]byte(s.seed))
		if err != nil {
			return nil, fmt.Errorf("identity keys %s: %s: %w", path, s.name, err)
		}
		if pub, _ := kp.PublicKey(); nkeys.Prefix(pub) != s.prefix {
			return nil, fmt.Errorf("identity keys %s: %s: wrong kind of key", path, s.name)
		}
		*s.dst = kp
	}
	return &k, nil
}

// Save writes k into dir (created 0700, the file 0600), refusing to
// overwrite existing keys.
func (k *Keys) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("identity keys: %w", err)
	}
	seed := func(kp nkeys.KeyPair) string {
		if kp == nil {
			return ""
		}
		s, _ := kp.Seed()
		return string(s)
	}
	data, err := json.MarshalIndent(keysFile{
		Operator: seed(k.Operator), OperatorSigning: seed(k.OperatorSigning),
		System: seed(k.System), Account: seed(k.Account), AccountSigning: seed(k.AccountSigning),
	}, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, KeysFileName)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("identity keys: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("identity keys: %w", err)
	}
	return f.Close()
}

// LoadOrCreateKeys reads dir's keys, or generates and saves them when dir
// has none: the embedded hub's first start.
func LoadOrCreateKeys(dir string) (*Keys, error) {
	k, err := LoadKeys(dir)
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if k, err = GenerateKeys(); err != nil {
		return nil, err
	}
	if err := k.Save(dir); err != nil {
		return nil, err
	}
	return k, nil
}

func pubOf(kp nkeys.KeyPair) string { p, _ := kp.PublicKey(); return p }

// AccountKey is the application account's public key.
func (k *Keys) AccountKey() string { return pubOf(k.Account) }

// SystemKey is the system account's public key.
func (k *Keys) SystemKey() string { return pubOf(k.System) }
