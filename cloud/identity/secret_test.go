package identity_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
)

// atollSystem starts a real apiserver with the namespace atoll-system.
func atollSystem(t *testing.T) (context.Context, kubernetes.Interface) {
	t.Helper()
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	if err := cluster.CreateNamespace(ctx, "atoll-system"); err != nil {
		t.Fatal(err)
	}
	return ctx, cluster.Client()
}

// TestSyncSecret keeps the embedded hub's identity in a Secret on a real
// apiserver: the first start makes the keys and stores them; a new,
// empty volume gets the same keys back; a restart writes nothing; a
// volume that predates the Secret fills it with its own keys; and what a
// retry cannot mend fails at once, naming it: no Secret, half an
// identity in it, a volume holding other keys.
func TestSyncSecret(t *testing.T) {
	ctx, client := atollSystem(t)
	secrets := client.CoreV1().Secrets("atoll-system")
	log := natstest.Logger(t, slog.LevelInfo)
	ref := types.NamespacedName{Namespace: "atoll-system", Name: "atoll-cloud-identity"}
	emptySecret := func(name string, data map[string][]byte) types.NamespacedName {
		t.Helper()
		if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		return types.NamespacedName{Namespace: "atoll-system", Name: name}
	}
	accountKey := func(dir string) string {
		t.Helper()
		k, err := identity.LoadKeys(dir)
		if err != nil {
			t.Fatal(err)
		}
		return k.AccountKey()
	}
	mustFail := func(ref types.NamespacedName, dir, want string) {
		t.Helper()
		start := time.Now()
		err := identity.SyncSecret(ctx, client, ref, dir, log)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("SyncSecret(%s, %s) = %v, want an error about %q", ref, dir, err, want)
		}
		if time.Since(start) > 10*time.Second {
			t.Errorf("SyncSecret retried %s before failing on %v", time.Since(start), err)
		}
	}

	mustFail(ref, t.TempDir(), "no Secret atoll-system/atoll-cloud-identity: create it empty")
	emptySecret(ref.Name, nil)
	first := filepath.Join(t.TempDir(), "identity")
	if err := identity.SyncSecret(ctx, client, ref, first, log); err != nil {
		t.Fatal(err)
	}
	stored, err := secrets.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{identity.KeysFileName, identity.TrustFileName} {
		onDisk, err := os.ReadFile(filepath.Join(first, f))
		if err != nil || string(onDisk) != string(stored.Data[f]) {
			t.Fatalf("%s: the Secret's %d bytes are not the directory's (%v)", f, len(stored.Data[f]), err)
		}
	}

	// A new volume: the same identity.
	second := filepath.Join(t.TempDir(), "identity")
	if err := identity.SyncSecret(ctx, client, ref, second, log); err != nil {
		t.Fatal(err)
	}
	if a, b := accountKey(first), accountKey(second); a != b {
		t.Fatalf("a new volume got account %s, want %s", b, a)
	}
	info, err := os.Stat(filepath.Join(second, identity.KeysFileName))
	if err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("restored keys: %v, mode %v, want 0600", err, info.Mode().Perm())
	}
	// A restart: nothing written.
	if err := identity.SyncSecret(ctx, client, ref, second, log); err != nil {
		t.Fatal(err)
	}
	again, err := secrets.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil || again.ResourceVersion != stored.ResourceVersion {
		t.Fatalf("a restart wrote the Secret (%v)", err)
	}

	// Another identity on the volume.
	other := t.TempDir()
	if _, _, err := identity.Setup(other); err != nil {
		t.Fatal(err)
	}
	mustFail(ref, other, "differs from the Secret atoll-system/atoll-cloud-identity's")
	// A volume of an installation that had no Secret: its keys kept.
	upgraded := emptySecret("upgraded", nil)
	if err := identity.SyncSecret(ctx, client, upgraded, other, log); err != nil {
		t.Fatal(err)
	}
	restored := t.TempDir()
	if err := identity.SyncSecret(ctx, client, upgraded, restored, log); err != nil {
		t.Fatal(err)
	}
	if a, b := accountKey(other), accountKey(restored); a != b {
		t.Fatalf("the volume's identity was not kept: account %s, want %s", b, a)
	}
	half := emptySecret("half", map[string][]byte{identity.KeysFileName: stored.Data[identity.KeysFileName]})
	mustFail(half, t.TempDir(), "holds only some of")
}

// TestSecretDurable keeps the registry's durable part in the identity
// Secret on a real apiserver: nothing kept reads as empty, a snapshot
// reads back as saved beside the keys (which stay), and saving it again
// writes nothing.
func TestSecretDurable(t *testing.T) {
	ctx, client := atollSystem(t)
	secrets := client.CoreV1().Secrets("atoll-system")
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "atoll-cloud-identity"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ref := types.NamespacedName{Namespace: "atoll-system", Name: "atoll-cloud-identity"}
	if err := identity.SyncSecret(ctx, client, ref, t.TempDir(), natstest.Logger(t, slog.LevelWarn)); err != nil {
		t.Fatal(err)
	}
	d := identity.SecretDurable{Client: client, Ref: ref}
	if s, err := d.Load(ctx); err != nil || len(s.Revocations) > 0 || len(s.Records) > 0 {
		t.Fatalf("nothing kept: %+v, %v", s, err)
	}
	want := identity.Snapshot{Revocations: jwt.RevocationList{"UKEY": 1700000000},
		Records: []identity.Record{{Node: "a", Key: "UKEY", Unit: "u1", Revoked: true, Issued: time.Unix(1700000000, 0).UTC()}}}
	if err := d.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	saved, err := secrets.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(saved.Data[identity.KeysFileName]) == 0 {
		t.Fatal("saving the registry dropped the keys")
	}
	got, err := d.Load(ctx)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v (%v), want %+v", got, err, want)
	}
	if err := d.Save(ctx, want); err != nil {
		t.Fatal(err)
	}
	again, err := secrets.Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil || again.ResourceVersion != saved.ResourceVersion {
		t.Fatalf("saving the same snapshot wrote the Secret (%v)", err)
	}
	// Garbage in the key: a permanent error naming it.
	again.Data[identity.RegistryFileName] = []byte("{not json")
	if _, err := secrets.Update(ctx, again, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load(ctx); !errors.Is(err, identity.ErrCorruptSnapshot) || !strings.Contains(err.Error(), "key registry.json") {
		t.Fatalf("a corrupt snapshot: %v, want ErrCorruptSnapshot naming the key", err)
	}
}
