package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/certgen"
	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestGeneratedCertsRotate runs the webhook module as atoll-cloud's
// ServiceAccount (deploy/base/atoll-cloud.yaml applied, a TokenRequest token)
// with generated certificates of very short lifetimes: over 26 s the CA
// rotates at least twice and the serving certificate many times, and
// every write the apiserver sends to the (fail-open) webhook comes back
// mutated, i.e. the apiserver trusted every certificate it was served and
// the caBundle followed each rotation.
func TestGeneratedCertsRotate(t *testing.T) {
	cluster := kubetest.Start(t)
	unrouteLogsAfter(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	data, err := deploy.Read(deploy.CloudManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeManifests(deploy.CloudManifest, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}
	rc, err := cluster.ServiceAccountConfig(ctx, "atoll-system", "atoll-cloud", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	asSA, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	kube := cluster.Client()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	whAddr := ln.Addr().String()
	_ = ln.Close()
	cfg := Config{Addr: whAddr, Certs: CertsGenerate, CALifetime: 15 * time.Second, CertLifetime: 3 * time.Second, CertCheckInterval: 200 * time.Millisecond}
	app := fxtest.New(t,
		fx.Supply(admin.Config{Addr: "127.0.0.1:0"}, cfg, testLogger(t)),
		fx.Supply(RegistrationConfig{Enabled: true, URL: "https://" + whAddr + DefaultPath}),
		fx.Provide(
			func() Policy { return protecting(protectedNode) },
			func() kubernetes.Interface { return asSA },
		),
		admin.Module,
		Module,
	)
	app.RequireStart()
	defer app.RequireStop()

	// A write the webhook must change: a not-ready address of the
	// protected node comes back ready.
	n := 0
	probe := func(ctx context.Context) error {
		n++
		eps := kube.CoreV1().Endpoints("default")
		got, err := eps.Create(ctx, &corev1.Endpoints{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("probe-%d", n)},
			Subsets: []corev1.EndpointSubset{{
				NotReadyAddresses: addrs(addr("10.1.0.1", protectedNode)),
				Ports:             []corev1.EndpointPort{{Port: 80, Protocol: corev1.ProtocolTCP}},
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		_ = eps.Delete(ctx, got.Name, metav1.DeleteOptions{})
		if len(got.Subsets) == 0 || len(got.Subsets[0].Addresses) == 0 {
			return fmt.Errorf("write %d not mutated: the apiserver could not call the webhook", n)
		}
		return nil
	}
	if err := poll.Until(ctx, probe); err != nil {
		t.Fatalf("webhook never effective: %v", err)
	}

	cas, servings := map[string]bool{}, map[string]bool{}
	failed := 0
	for end := time.Now().Add(26 * time.Second); time.Now().Before(end); {
		if err := probe(ctx); err != nil {
			failed++
			t.Error(err)
		}
		s, err := kube.CoreV1().Secrets("atoll-system").Get(ctx, DefaultCertSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		bundle := certgen.ParseCerts(s.Data[certgen.SecretCABundle])
		cas[string(bundle[0].Raw)] = true
		servings[string(s.Data[corev1.TLSCertKey])] = true
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("%d writes, %d not mutated; %d CAs, %d serving certificates", n, failed, len(cas), len(servings))
	if len(cas) < 3 {
		t.Errorf("%d CAs in 26 s, want the first and at least two rotations", len(cas))
	}
	if len(servings) < 5 {
		t.Errorf("%d serving certificates in 26 s, want at least 5", len(servings))
	}
	// The served certificate chains to the registered bundle.
	mwc, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, DefaultName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle)
	conn, err := tls.Dial("tcp", whAddr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // verified below against the bundle
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ConnectionState().PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool}); err != nil {
		t.Errorf("served certificate does not chain to the caBundle: %v", err)
	}
}
