package identity_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/atoll-edge/atoll/cloud/identity"
)

// TestOperatorKeyOffline: once the trust is made, the operator's identity
// seed can leave keys.json; the installation keeps working (same trust,
// JWTs still issued), and a trust cannot be made without it.
func TestOperatorKeyOffline(t *testing.T) {
	dir := t.TempDir()
	_, trust, err := identity.Setup(dir)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, identity.KeysFileName)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]string
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	delete(f, "operator")
	data, _ = json.Marshal(f)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	keys, again, err := identity.Setup(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again != trust {
		t.Error("the trust changed")
	}
	if _, err := identity.NewIssuer(keys, "hub").Operator("ops", "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4", 0); err != nil {
		t.Errorf("issue without the operator key: %v", err)
	}
	if _, err := identity.NewTrust(keys); err == nil {
		t.Error("a trust signed without the operator key")
	}
}
