package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

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
		bundle := parseCerts(s.Data[SecretCABundle])
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

// TestRotatorReplicas: replicas that start at once on the empty Secret
// agree on one CA and certificate (one write wins, the other adopts it); a
// restarted replica writes nothing; a damaged serving certificate is
// reissued under the same CA; a lost CA key makes a new CA that joins the
// old one in the bundle; a serving certificate in its last third is
// renewed.
func TestRotatorReplicas(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kube := cluster.Client()
	if err := cluster.CreateNamespace(ctx, "atoll-system"); err != nil {
		t.Fatal(err)
	}
	secrets := kube.CoreV1().Secrets("atoll-system")
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: DefaultCertSecret}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hosts := []string{"atoll-cloud-webhook.atoll-system.svc", "127.0.0.1"}
	newRotator := func() (*Rotator, *metrics) {
		m := newMetrics(nil)
		r, err := NewRotator(kube, DefaultConfig(), hosts, testLogger(t), m)
		if err != nil {
			t.Fatal(err)
		}
		return r, m
	}
	serial := func(r *Rotator) string {
		c, err := r.GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.Leaf.SerialNumber.String()
	}
	writes := func(ms ...*metrics) float64 {
		var n float64
		for _, m := range ms {
			for _, w := range []string{rotateNewCA, rotateServing, rotateToCurrent, rotateDroppedOld} {
				n += counterValue(t, m.rotations.WithLabelValues(w))
			}
		}
		return n
	}
	secret := func() *corev1.Secret {
		s, err := secrets.Get(ctx, DefaultCertSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	// Two replicas at once.
	a, ma := newRotator()
	b, mb := newRotator()
	errs := make(chan error, 2)
	go func() { errs <- a.Sync(ctx) }()
	go func() { errs <- b.Sync(ctx) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if serial(a) != serial(b) {
		t.Fatal("the replicas serve different certificates")
	}
	bundleA, _ := a.CABundle()
	bundleB, _ := b.CABundle()
	if string(bundleA) != string(bundleB) || len(parseCerts(bundleA)) != 1 {
		t.Fatalf("bundles differ or hold %d CAs", len(parseCerts(bundleA)))
	}
	if n := writes(ma, mb); n != 2 { // one CA and one serving certificate, by one of them
		t.Fatalf("%v rotations counted, want the winner's 2", n)
	}
	for _, c := range parseCerts(bundleA) {
		leaf, _ := a.GetCertificate(nil)
		if leaf.Leaf.CheckSignatureFrom(c) != nil {
			t.Error("serving certificate not signed by the bundle's CA")
		}
	}

	// A restart writes nothing.
	rv := secret().ResourceVersion
	c, mc := newRotator()
	if err := c.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if serial(c) != serial(a) || secret().ResourceVersion != rv || writes(mc) != 0 {
		t.Fatal("a restarted replica changed the certificates")
	}

	// A damaged serving certificate: reissued, same CA.
	s := secret()
	s.Data[corev1.TLSCertKey] = []byte("garbage")
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if bundle, _ := a.CABundle(); string(bundle) != string(bundleA) || serial(a) == serial(c) {
		t.Fatal("damaged certificate: want a new serving certificate under the same CA")
	}

	// A serving certificate in its last third: renewed, same CA.
	before := serial(a)
	a.now = func() time.Time { return time.Now().Add(DefaultCertLifetime * 2 / 3).Add(time.Hour) }
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if bundle, _ := a.CABundle(); string(bundle) != string(bundleA) || serial(a) == before {
		t.Fatal("due certificate: want a new serving certificate under the same CA")
	}
	a.now = time.Now

	// The CA key lost: a new CA, the old one kept in the bundle while the
	// served certificate (signed by it) is still valid; the other replica
	// follows at its next sync, and registers the new bundle.
	s = secret()
	delete(s.Data, SecretCAKey)
	if _, err := secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, changed := b.CABundle()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	bundle, _ := a.CABundle()
	if cas := parseCerts(bundle); len(cas) != 2 || !cas[1].Equal(parseCerts(bundleA)[0]) {
		t.Fatalf("bundle after a lost CA key: %d CAs, want the new one and the old one", len(cas))
	}
	if err := b.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	default:
		t.Fatal("the other replica did not see the bundle change")
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
