package hubtls_test

import (
	"context"
	"crypto/x509"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/certgen"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestModule runs the module against a real apiserver, on the empty
// Secret the manifests create: at start the Secret holds a CA and a
// certificate, the ConfigMap the CA bundle, and the certificate served
// verifies against that bundle under the edges' name; a restart writes
// neither object again.
func TestModule(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := cluster.Client()
	if err := cluster.CreateNamespace(ctx, "atoll-system"); err != nil {
		t.Fatal(err)
	}
	cfg := hubtls.DefaultConfig("atoll-system")
	secrets, cms := client.CoreV1().Secrets("atoll-system"), client.CoreV1().ConfigMaps("atoll-system")
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: cfg.Secret.Name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := func() (hub.LeafCertificates, *fxtest.App) {
		var certs hub.LeafCertificates
		app := fxtest.New(t,
			fx.Supply(admin.Config{Addr: "127.0.0.1:0"}, cfg, slog.New(slog.DiscardHandler)),
			fx.Provide(func() kubernetes.Interface { return client }),
			admin.Module,
			hubtls.Module,
			fx.Populate(&certs),
		)
		app.RequireStart()
		return certs, app
	}
	certs, app := start()
	cm, err := cms.Get(ctx, cfg.CABundle.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(cm.Data[hubtls.CAKey])) {
		t.Fatalf("ConfigMap %s holds no CA: %v", cfg.CABundle, cm.Data)
	}
	cert, err := certs.GetCertificate(nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: hubtls.DefaultHost}); err != nil {
		t.Errorf("the served certificate does not verify as %s against the published bundle: %v", hubtls.DefaultHost, err)
	}
	s, err := secrets.Get(ctx, cfg.Secret.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(certgen.ParseCerts(s.Data[certgen.SecretCABundle])) != 1 || len(s.Data[corev1.TLSCertKey]) == 0 {
		t.Errorf("Secret %s: %d keys, want a CA and a certificate", cfg.Secret, len(s.Data))
	}
	app.RequireStop()

	_, again := start()
	defer again.RequireStop()
	s2, _ := secrets.Get(ctx, cfg.Secret.Name, metav1.GetOptions{})
	cm2, _ := cms.Get(ctx, cfg.CABundle.Name, metav1.GetOptions{})
	if s2.ResourceVersion != s.ResourceVersion || cm2.ResourceVersion != cm.ResourceVersion {
		t.Error("a restart wrote the certificates or the bundle again")
	}
}
