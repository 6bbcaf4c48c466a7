package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nats-io/jwt/v2"
)

// Trust is what a hub server needs to authenticate Atoll's identities: the
// operator JWT it trusts and the account JWTs it preloads into its
// resolver. None of it is secret.
type Trust struct {
	Operator string `json:"operator"`
	// SystemAccount and Account are the accounts' public keys.
	SystemAccount string `json:"system_account"`
	Account       string `json:"account"`
	// SystemJWT and AccountJWT are the accounts' first JWTs; the servers
	// keep newer ones (revocations) in their resolver directory.
	SystemJWT  string `json:"system_jwt"`
	AccountJWT string `json:"account_jwt"`
}

// TrustFileName is the file in an identity directory that holds the trust.
const TrustFileName = "trust.json"

// NewTrust signs the operator and account JWTs of k.
func NewTrust(k *Keys) (Trust, error) {
	if k.Operator == nil {
		return Trust{}, errors.New("identity: the operator key is needed to sign the trust")
	}
	op := jwt.NewOperatorClaims(pubOf(k.Operator))
	op.Name = OperatorName
	op.SystemAccount = k.SystemKey()
	op.SigningKeys.Add(pubOf(k.OperatorSigning))
	opJWT, err := op.Encode(k.Operator)
	if err != nil {
		return Trust{}, fmt.Errorf("identity: operator JWT: %w", err)
	}
	sys := jwt.NewAccountClaims(k.SystemKey())
	sys.Name = SystemAccount
	sysJWT, err := sys.Encode(k.OperatorSigning)
	if err != nil {
		return Trust{}, fmt.Errorf("identity: system account JWT: %w", err)
	}
	app := jwt.NewAccountClaims(k.AccountKey())
	app.Name = AppAccount
	app.SigningKeys.Add(pubOf(k.AccountSigning))
	app.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	appJWT, err := app.Encode(k.OperatorSigning)
	if err != nil {
		return Trust{}, fmt.Errorf("identity: application account JWT: %w", err)
	}
	return Trust{Operator: opJWT, SystemAccount: k.SystemKey(), Account: k.AccountKey(), SystemJWT: sysJWT, AccountJWT: appJWT}, nil
}

// LoadOrCreateTrust reads dir's trust, or signs and saves it. The account
// JWTs are made once: a server preloads them at every start, and a
// preloaded JWT older than the one in its resolver (with revocations) is
// ignored.
func LoadOrCreateTrust(dir string, k *Keys) (Trust, error) {
	path := filepath.Join(dir, TrustFileName)
	data, err := os.ReadFile(filepath.Clean(path))
	if err == nil {
		var t Trust
		if err := json.Unmarshal(data, &t); err != nil {
			return Trust{}, fmt.Errorf("identity trust %s: %w", path, err)
		}
		if t.Account != k.AccountKey() || t.SystemAccount != k.SystemKey() {
			return Trust{}, fmt.Errorf("identity trust %s: accounts do not match the keys of %s", path, KeysFileName)
		}
		return t, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return Trust{}, fmt.Errorf("identity trust: %w", err)
	}
	t, err := NewTrust(k)
	if err != nil {
		return Trust{}, err
	}
	if data, err = json.MarshalIndent(t, "", "  "); err != nil {
		return Trust{}, err
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return Trust{}, fmt.Errorf("identity trust: %w", err)
	}
	return t, nil
}

// Setup loads (or on first use creates) the keys and trust of dir.
func Setup(dir string) (*Keys, Trust, error) {
	k, err := LoadOrCreateKeys(dir)
	if err != nil {
		return nil, Trust{}, err
	}
	t, err := LoadOrCreateTrust(dir, k)
	if err != nil {
		return nil, Trust{}, err
	}
	return k, t, nil
}

// ServerConfig is the part of a nats-server configuration that makes it
// trust t with a full resolver in dir (stock nats-server syntax).
func (t Trust) ServerConfig(resolverDir string) string {
	return fmt.Sprintf(`operator: %q
system_account: %s
resolver: { type: full, dir: %q, allow_delete: false, interval: "2m", timeout: "2s" }
resolver_preload: { %s: %q, %s: %q }
`, t.Operator, t.SystemAccount, resolverDir, t.SystemAccount, t.SystemJWT, t.Account, t.AccountJWT)
}
