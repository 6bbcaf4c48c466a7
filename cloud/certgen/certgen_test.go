package certgen

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/test/kubetest"
)

const testSecret = "atoll-test-certs"

// testConfig is a production-like configuration for hosts.
func testConfig(hosts []string) Config {
	return Config{Secret: types.NamespacedName{Namespace: "atoll-system", Name: testSecret}, Hosts: hosts, Purpose: "test",
		CALifetime: 365 * 24 * time.Hour, CertLifetime: 30 * 24 * time.Hour, CheckInterval: time.Minute}
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
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: testSecret}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hosts := []string{"atoll-cloud-webhook.atoll-system.svc", "127.0.0.1"}
	newRotator := func() (*Rotator, *prometheus.CounterVec) {
		m := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "rotations"}, []string{"what"})
		r, err := NewRotator(kube, testConfig(hosts), slog.New(slog.DiscardHandler), Metrics{Rotations: m})
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
	writes := func(ms ...*prometheus.CounterVec) float64 {
		var n float64
		for _, m := range ms {
			for _, w := range Reasons {
				n += counterValue(t, m.WithLabelValues(w))
			}
		}
		return n
	}
	secret := func() *corev1.Secret {
		s, err := secrets.Get(ctx, testSecret, metav1.GetOptions{})
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
	if string(bundleA) != string(bundleB) || len(ParseCerts(bundleA)) != 1 {
		t.Fatalf("bundles differ or hold %d CAs", len(ParseCerts(bundleA)))
	}
	if n := writes(ma, mb); n != 2 { // one CA and one serving certificate, by one of them
		t.Fatalf("%v rotations counted, want the winner's 2", n)
	}
	for _, c := range ParseCerts(bundleA) {
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
	a.now = func() time.Time { return time.Now().Add(testConfig(nil).CertLifetime * 2 / 3).Add(time.Hour) }
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
	if cas := ParseCerts(bundle); len(cas) != 2 || !cas[1].Equal(ParseCerts(bundleA)[0]) {
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

// TestConfigValidate: each bad field is named.
func TestConfigValidate(t *testing.T) {
	good := testConfig([]string{"atoll-hub"})
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Config){
		"no Secret":         func(c *Config) { c.Secret.Name = "" },
		"no host names":     func(c *Config) { c.Hosts = nil },
		"must be positive":  func(c *Config) { c.CheckInterval = 0 },
		"more than a third": func(c *Config) { c.CertLifetime = c.CALifetime },
		"nine check":        func(c *Config) { c.CheckInterval = c.CertLifetime / 8 },
	} {
		c := good
		mutate(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
