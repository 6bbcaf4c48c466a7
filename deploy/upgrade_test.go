package deploy_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/cloud/webhook"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestUpgradeKeepsAtollCloudState: re-applying an overlay, as an upgrade
// does, keeps what atoll-cloud wrote into the objects the manifests create
// empty (the webhooks of atoll-health and their caBundle, the generated
// certificates in atoll-cloud-webhook-certs), whether the installation
// was made with client-side apply (`kubectl apply -f` of the files before
// the kustomize layout, or `kubectl apply -k`) and is re-applied that way,
// or is moved to server-side apply (`kubectl apply --server-side -k`, what
// deploy/UPGRADING.md gives; the move forces kubectl's own conflicts
// once, and later applies have none).
func TestUpgradeKeepsAtollCloudState(t *testing.T) {
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	overlay := filepath.Join("overlays", "embedded-hub")
	apply := func(args ...string) {
		t.Helper()
		args = append([]string{"--kubeconfig", cluster.KubeconfigPath(), "apply"}, args...)
		out, err := exec.CommandContext(ctx, kubectl, append(args, "-k", overlay)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v -k %s: %v\n%s", args, overlay, err, out)
		}
	}
	apply() // the installation, client-side

	// What atoll-cloud writes at its start, as it writes it: the webhooks
	// (server-side apply, its field manager) and the certificates (update).
	client := cluster.Client()
	reg := webhook.DefaultRegistrationConfig()
	reg.Service = webhook.ServiceRef{Namespace: "atoll-system", Name: "atoll-cloud-webhook"}
	reg.CABundle = cluster.CABundle()
	if err := webhook.Register(ctx, client, reg); err != nil {
		t.Fatal(err)
	}
	secrets := client.CoreV1().Secrets("atoll-system")
	s, err := secrets.Get(ctx, "atoll-cloud-webhook-certs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	certs := map[string][]byte{"ca.crt": cluster.CABundle(), "tls.crt": []byte("serving certificate"), "tls.key": []byte("serving key")}
	s.Data = certs
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{FieldManager: wellknown.FieldManager}); err != nil {
		t.Fatal(err)
	}
	hooks := func() int {
		t.Helper()
		c, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, reg.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range c.Webhooks {
			if !bytes.Equal(h.ClientConfig.CABundle, reg.CABundle) {
				t.Errorf("webhook %s lost its caBundle", h.Name)
			}
		}
		return len(c.Webhooks)
	}
	want := hooks()
	if want == 0 {
		t.Fatal("atoll-cloud registered no webhook")
	}

	for _, step := range []struct {
		name string
		args []string
	}{
		{"client-side again", nil},
		// Once, from client-side apply: kubectl's own client-side manager
		// (kubectl-client-side-apply) holds fields whose values the
		// apiserver defaulted (a fieldRef's apiVersion, a
		// volumeClaimTemplate's volumeMode), which conflict.
		{"server-side from client-side", []string{"--server-side", "--force-conflicts"}},
		// Then never: no field of the manifests is atoll-cloud's.
		{"server-side again", []string{"--server-side"}},
	} {
		apply(step.args...)
		if got := hooks(); got != want {
			t.Errorf("after %s apply: %d webhooks in %s, atoll-cloud registered %d", step.name, got, reg.Name, want)
		}
		s, err := secrets.Get(ctx, "atoll-cloud-webhook-certs", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range certs {
			if !bytes.Equal(s.Data[k], v) {
				t.Errorf("after %s apply: Secret atoll-cloud-webhook-certs lost %s", step.name, k)
			}
		}
	}
}
