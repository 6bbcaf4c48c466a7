package identity

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// identityFiles are the files of an identity directory that a Secret
// keeps, as its keys.
var identityFiles = []string{KeysFileName, TrustFileName}

// SyncSecret keeps the identity of dir in the Secret ref (created empty
// by the manifests), so that it outlives the volume dir is on: every
// credential the hub trusts is signed with these keys.
//   - The Secret holds them: they are written into dir (an empty dir, or
//     one holding the same files). A dir holding other keys is refused:
//     one of the two was replaced, and going on would invalidate every
//     credential signed with the other.
//   - The Secret is empty: dir's keys, made first when dir has none (the
//     first start), are written into it.
//
// It retries what the apiserver refuses for a while (a conflict, an
// unreachable apiserver) until ctx ends, and fails at once on what a
// retry cannot mend: no such Secret, half an identity in it, a conflict
// with dir.
func SyncSecret(ctx context.Context, client kubernetes.Interface, ref types.NamespacedName, dir string, log *slog.Logger) error {
	delay := 250 * time.Millisecond
	for {
		err := syncSecretOnce(ctx, client, ref, dir, log)
		var perm permanentError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &perm):
			return perm.error
		}
		log.Warn("identity keys: cannot sync with their Secret yet; retrying", "secret", ref.String(), "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("identity keys: Secret %s: %w", ref, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// permanentError is a failure SyncSecret does not retry.
type permanentError struct{ error }

func syncSecretOnce(ctx context.Context, client kubernetes.Interface, ref types.NamespacedName, dir string, log *slog.Logger) error {
	secret, err := client.CoreV1().Secrets(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return permanentError{fmt.Errorf("identity keys: no Secret %s: create it empty (the embedded-hub overlay does), atoll-cloud fills it", ref)}
	}
	if err != nil {
		return err
	}
	held := 0
	for _, f := range identityFiles {
		if len(secret.Data[f]) > 0 {
			held++
		}
	}
	switch held {
	case len(identityFiles):
		return restore(secret, dir, log)
	case 0:
		return store(ctx, client, secret, dir, log)
	}
	return permanentError{fmt.Errorf("identity keys: Secret %s holds only some of %v: restore the missing key from a backup, or empty the Secret and its volume to make a new identity (every credential must then be issued again)", ref, identityFiles)}
}

// restore writes the Secret's identity into dir, unless dir holds another.
func restore(secret *corev1.Secret, dir string, log *slog.Logger) error {
	ref := types.NamespacedName{Namespace: secret.Namespace, Name: secret.Name}
	var missing []string
	for _, f := range identityFiles {
		have, err := os.ReadFile(filepath.Join(dir, f))
		switch {
		case errors.Is(err, os.ErrNotExist):
			missing = append(missing, f)
		case err != nil:
			return permanentError{fmt.Errorf("identity keys: %w", err)}
		case !bytes.Equal(have, secret.Data[f]):
			return permanentError{fmt.Errorf("identity keys: %s differs from the Secret %s's: one of them was replaced; keep the one the hub servers and the edges' credentials were made with and remove the other", filepath.Join(dir, f), ref)}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return permanentError{fmt.Errorf("identity keys: %w", err)}
	}
	for _, f := range missing {
		if err := writeFileAtomic(filepath.Join(dir, f), secret.Data[f]); err != nil {
			return permanentError{fmt.Errorf("identity keys: %w", err)}
		}
	}
	log.Info("identity keys restored from their Secret", "secret", ref.String(), "dir", dir, "files", missing)
	return nil
}

// store writes dir's identity, made first when dir has none, into the
// empty Secret (an update conditional on the version read).
func store(ctx context.Context, client kubernetes.Interface, secret *corev1.Secret, dir string, log *slog.Logger) error {
	_, statErr := os.Stat(filepath.Join(dir, KeysFileName))
	created := errors.Is(statErr, os.ErrNotExist)
	if _, _, err := Setup(dir); err != nil {
		return permanentError{err}
	}
	secret = secret.DeepCopy()
	if secret.Data == nil {
		secret.Data = map[string][]byte{}
	}
	for _, f := range identityFiles {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return permanentError{fmt.Errorf("identity keys: %w", err)}
		}
		secret.Data[f] = data
	}
	if _, err := client.CoreV1().Secrets(secret.Namespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return err
	}
	what := "identity keys of the volume stored in their Secret"
	if created {
		what = "identity keys made and stored in their Secret"
	}
	log.Info(what, "secret", secret.Namespace+"/"+secret.Name, "dir", dir)
	return nil
}

// writeFileAtomic writes data to path (0600) through a temporary file, so
// that a crash leaves the old file or the new one.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Durable keeps what of the registry must outlive the hub's store (a new
// volume of the embedded hub): the revocation list, which also spends the
// bootstrap tokens, and the records of revoked and suspended nodes,
// without which a suspension could not be lifted. Nodes' keys need no
// keeping: a node the registry does not know records its key again when
// it renews (Service.reregister).
type Durable interface {
	// Load returns the last snapshot saved (empty when none).
	Load(ctx context.Context) (Snapshot, error)
	// Save keeps s, writing nothing when it is what is kept already.
	Save(ctx context.Context, s Snapshot) error
}

// Snapshot is the durable part of the registry.
type Snapshot struct {
	Revocations jwt.RevocationList `json:"revocations,omitempty"`
	// Records are the revoked and suspended nodes', by node.
	Records []Record `json:"records,omitempty"`
}

// ErrCorruptSnapshot is a kept snapshot that does not decode: no retry
// mends it, and going on would forget its revocations.
var ErrCorruptSnapshot = errors.New("identity registry: the kept revocations do not decode")

// RegistryFileName is the key of the Secret that holds a Snapshot.
const RegistryFileName = "registry.json"

// SecretDurable keeps the snapshot in the key registry.json of the
// Secret ref, beside the identity keys (SyncSecret).
type SecretDurable struct {
	Client kubernetes.Interface
	Ref    types.NamespacedName
}

// Load implements Durable.
func (d SecretDurable) Load(ctx context.Context) (Snapshot, error) {
	secret, err := d.Client.CoreV1().Secrets(d.Ref.Namespace).Get(ctx, d.Ref.Name, metav1.GetOptions{})
	if err != nil {
		return Snapshot{}, fmt.Errorf("identity registry: Secret %s: %w", d.Ref, err)
	}
	var s Snapshot
	if data := secret.Data[RegistryFileName]; len(data) > 0 {
		if err := json.Unmarshal(data, &s); err != nil {
			return Snapshot{}, fmt.Errorf("%w: Secret %s key %s: %w (restore it from a backup, or remove the key and revoke again every node revoked before)",
				ErrCorruptSnapshot, d.Ref, RegistryFileName, err)
		}
	}
	return s, nil
}

// Save implements Durable (an update conditional on the version read).
func (d SecretDurable) Save(ctx context.Context, s Snapshot) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	secret, err := d.Client.CoreV1().Secrets(d.Ref.Namespace).Get(ctx, d.Ref.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("identity registry: Secret %s: %w", d.Ref, err)
	}
	if bytes.Equal(secret.Data[RegistryFileName], data) {
		return nil
	}
	secret = secret.DeepCopy()
	if secret.Data == nil {
		secret.Data = map[string][]byte{}
	}
	secret.Data[RegistryFileName] = data
	if _, err := d.Client.CoreV1().Secrets(d.Ref.Namespace).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("identity registry: Secret %s: %w", d.Ref, err)
	}
	return nil
}
