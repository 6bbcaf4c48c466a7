package natsnode_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestWaitsForEnrollmentCredentials: a node that is to enroll with the
// shared enrollment credentials starts before atoll-cloud has written them
// (the Secret's key is absent from the pod's volume): its server runs,
// unlinked, waiting; a file that is not credentials changes nothing; once
// the credentials are there it links to the hub with them.
func TestWaitsForEnrollmentCredentials(t *testing.T) {
	h := natstest.Hub(t)
	dir := t.TempDir()
	cfg := natsnode.Default()
	cfg.NodeName = "e1"
	cfg.ClientPort, cfg.RoutePort, cfg.RouteHost = -1, -1, "127.0.0.1"
	cfg.HubURLs = h.LeafURLs()
	cfg.CredsFile = filepath.Join(dir, "node.creds")
	cfg.EnrollCredsFile = filepath.Join(dir, "enroll", "enroll.creds")
	n, err := natsnode.New(cfg, natstest.Logger(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Shutdown(context.Background()) })
	if !n.EnrollmentPending() || n.EnrollingByServiceAccount() {
		t.Fatalf("pending %v, enrolling %v: want a node waiting for its enrollment credentials", n.EnrollmentPending(), n.EnrollingByServiceAccount())
	}
	if err := os.MkdirAll(filepath.Dir(cfg.EnrollCredsFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.EnrollCredsFile, []byte("not credentials\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // two looks at a file that is not credentials
	if !n.EnrollmentPending() || n.Status().HubConnected {
		t.Fatalf("linked (%v) with a file that holds no credentials", n.Status().HubConnected)
	}

	pub := writeEnrollCreds(t, h.Issuer().Enroller, cfg.EnrollCredsFile)
	poll.Eventually(t, 10*time.Second, func() error {
		if !n.Status().HubConnected {
			return errors.New("not linked to the hub yet")
		}
		return nil
	})
	if n.EnrollmentPending() || !n.EnrollingByServiceAccount() || n.PublicKey() != pub {
		t.Fatalf("pending %v, enrolling %v, key %s: want linked with the enrollment credentials (%s)",
			n.EnrollmentPending(), n.EnrollingByServiceAccount(), n.PublicKey(), pub)
	}
}

// TestCredsCopyBesideTheCredsFile: the copy of the credentials the leaf
// link reads lives beside the node's creds file, where the next start
// writes it again, and never in the temporary directory, where a killed
// agent would leave the node's key behind.
func TestCredsCopyBesideTheCredsFile(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	h := natstest.Hub(t)
	dir := t.TempDir()
	cfg := natsnode.Default()
	cfg.NodeName = "e1"
	cfg.ClientPort, cfg.RoutePort, cfg.RouteHost = -1, -1, "127.0.0.1"
	cfg.HubURLs = h.LeafURLs()
	cfg.CredsFile = filepath.Join(dir, "node.creds")
	cfg.EnrollCredsFile = filepath.Join(dir, "enroll.creds")
	writeEnrollCreds(t, h.Issuer().Enroller, cfg.EnrollCredsFile)
	n, err := natsnode.New(cfg, natstest.Logger(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if !n.Status().HubConnected {
			return errors.New("not linked to the hub yet")
		}
		return nil
	})
	link := filepath.Join(dir, ".node.creds.link")
	if st, err := os.Stat(link); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the link's credentials copy: %v (mode %v), want %s, 0600", err, st, link)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("%d entries in the temporary directory, want none", len(left))
	}
	if err := n.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(link); !os.IsNotExist(err) {
		t.Errorf("the copy outlived Shutdown: %v", err)
	}
}

// writeEnrollCreds writes to path enrollment credentials for a new key,
// its JWT from enroller (the hub's issuer), and returns the key.
func writeEnrollCreds(t *testing.T, enroller func(pub string) (string, error), path string) string {
	t.Helper()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	userJWT, err := enroller(pub)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := jwt.FormatUserConfig(userJWT, seed)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	return pub
}
