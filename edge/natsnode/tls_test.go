package natsnode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// linkState waits until n's leaf link to the hub is up (want) or, for
// want false, checks that it stays down for a while: a refused TLS
// handshake leaves nothing else to wait for.
func linkState(t *testing.T, n *natsnode.Node, want bool) {
	t.Helper()
	if want {
		poll.Eventually(t, 20*time.Second, func() error {
			if !n.Status().HubConnected {
				return fmt.Errorf("%s not linked", n.Name())
			}
			return nil
		})
		return
	}
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if n.Status().HubConnected {
			t.Fatalf("%s linked to the hub", n.Name())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLeafTLS: a hub whose leaf listener has a certificate requires TLS.
// An edge that trusts the certificate's CA links; one that trusts another
// CA, or none, or expects another name, is refused; one that names the
// certificate's name while dialing an address links. A renewed
// certificate in the same files is served to the next connection without
// a restart, and an edge whose CA file is updated in place links with
// the new bundle without a restart.
func TestLeafTLS(t *testing.T) {
	dir := t.TempDir()
	first, other := natstest.NewTLS(t, dir, "first"), natstest.NewTLS(t, dir, "other")
	h := natstest.Hub(t, func(c *natstest.HubConfig) {
		c.LeafTLS = natstest.HubTLS{CertFile: first.CertFile, KeyFile: first.KeyFile}
	})

	good := natstest.Edge(t, h, "good", natstest.EdgeOptions{HubCAFile: first.CAFile})
	wrongCA := natstest.Edge(t, h, "wrong-ca", natstest.EdgeOptions{HubCAFile: other.CAFile})
	plain := natstest.Edge(t, h, "plain", natstest.EdgeOptions{})
	named := natstest.Edge(t, h, "named", natstest.EdgeOptions{HubCAFile: first.CAFile, HubServerName: "localhost"})
	misnamed := natstest.Edge(t, h, "misnamed", natstest.EdgeOptions{HubCAFile: first.CAFile, HubServerName: "atoll-hub.example"})
	// Its bundle starts wrong; updated in place below.
	updated := filepath.Join(dir, "updated-ca.crt")
	copyFile(t, other.CAFile, updated)
	later := natstest.Edge(t, h, "later", natstest.EdgeOptions{HubCAFile: updated})
	linkState(t, good, true)
	linkState(t, named, true)
	linkState(t, wrongCA, false)
	linkState(t, plain, false)
	linkState(t, misnamed, false)
	linkState(t, later, false)
	copyFile(t, first.CAFile, updated)
	linkState(t, later, true)

	// The hub's certificate is renewed in place, now signed by the other
	// CA: an edge that trusts that CA links without the hub restarting.
	for _, p := range [][2]string{{other.CertFile, first.CertFile}, {other.KeyFile, first.KeyFile}} {
		copyFile(t, p[0], p[1])
	}
	renewed := natstest.Edge(t, h, "renewed", natstest.EdgeOptions{HubCAFile: other.CAFile})
	linkState(t, renewed, true)
}

// copyFile replaces to with from's content, its modification time a
// second ahead (so a reader that compares it sees a change).
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(to, later, later); err != nil {
		t.Fatal(err)
	}
}

// TestHubCAFileErrors: a CA file that is missing or holds no certificate
// stops the node with the file named.
func TestHubCAFileErrors(t *testing.T) {
	dir := t.TempDir()
	empty := dir + "/empty.pem"
	if err := os.WriteFile(empty, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ file, want string }{
		{dir + "/missing.pem", "hub CA file"},
		{empty, "no PEM certificate"},
	} {
		cfg := natsnode.Default()
		cfg.NodeName, cfg.ClientPort, cfg.RoutePort = "a", -1, -1
		kp, _ := nkeys.CreateUser()
		raw, _ := kp.Seed()
		cfg.Seed, cfg.CredsFile = string(raw), ""
		cfg.HubURLs, cfg.HubCAFile = []string{"nats-leaf://127.0.0.1:7422"}, tc.file
		_, err := natsnode.New(cfg, natstest.Logger(t, 0))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CA file %s: got %v, want an error with %q", tc.file, err, tc.want)
		}
	}
}
