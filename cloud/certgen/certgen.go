// Package certgen generates a CA and a serving certificate, keeps them in
// one Kubernetes Secret that every replica of atoll-cloud shares, and
// rotates both before they expire: the admission webhook's certificate
// (cloud/webhook) and the embedded hub's leaf listener's (cloud/hubtls).
package certgen

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Keys of the certificate Secret, besides tls.crt and tls.key (the
// serving certificate and its key).
const (
	// SecretCABundle holds the CAs clients must trust, PEM, the current
	// one first, then earlier ones until they expire.
	SecretCABundle = "ca.crt"
	// SecretCAKey is the current CA's private key.
	SecretCAKey = "ca.key"
)

// Config says what to generate and where to keep it.
type Config struct {
	// Secret holds the certificates; it must exist (the manifests create
	// it empty, so atoll-cloud needs only get and update on it).
	Secret types.NamespacedName
	// Hosts are the serving certificate's names (DNS names or IP
	// addresses); the first is its common name.
	Hosts []string
	// Purpose names the certificates in logs and errors ("webhook").
	Purpose string
	// CALifetime and CertLifetime are the CA's and the serving
	// certificate's lifetimes; each is renewed in its last third.
	CALifetime, CertLifetime time.Duration
	// CheckInterval is how often Run re-reads the Secret.
	CheckInterval time.Duration
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Secret.Name == "" || c.Secret.Namespace == "":
		return fmt.Errorf("%s certificates: no Secret", c.Purpose)
	case len(c.Hosts) == 0:
		return fmt.Errorf("%s certificates: no host names for the serving certificate", c.Purpose)
	case c.CALifetime <= 0 || c.CertLifetime <= 0 || c.CheckInterval <= 0:
		return fmt.Errorf("%s certificates: lifetimes and check interval must be positive", c.Purpose)
	case 3*c.CertLifetime > c.CALifetime:
		// The CA is renewed with a third of its life left: a serving
		// certificate must fit in that, so it never outlives its CA.
		return fmt.Errorf("%s certificates: cert lifetime %s is more than a third of the ca lifetime %s", c.Purpose, c.CertLifetime, c.CALifetime)
	case c.CertLifetime < 9*c.CheckInterval:
		return fmt.Errorf("%s certificates: cert lifetime %s is shorter than nine check intervals (%s)", c.Purpose, c.CertLifetime, c.CheckInterval)
	}
	return nil
}

// Metrics are the rotator's: rotations written by this replica, by
// reason (Reasons), and the serving certificate's expiry. Nil fields are
// not recorded.
type Metrics struct {
	Rotations *prometheus.CounterVec
	Expiry    prometheus.Gauge
}

// backdate is how far before its creation a certificate is valid, for
// clocks a little behind ours.
const backdate = time.Minute

// Rotator generates a CA and a serving certificate, keeps them in one
// Secret that every replica shares, and rotates both before they expire.
// A rotated CA is added to the bundle beside the old one first; the
// serving certificate moves to it only once the new bundle had time to
// reach the clients (two check intervals), so they trust every
// certificate a replica serves throughout. Writes
// are updates with the Secret's resourceVersion: when two replicas rotate
// at once, one wins and the other adopts its result.
type Rotator struct {
	client kubernetes.Interface
	cfg    Config
	hosts  []string
	log    *slog.Logger
	m      Metrics
	now    func() time.Time

	mu      sync.Mutex
	cert    *tls.Certificate
	certPEM []byte
	keyPEM  []byte
	bundle  []byte
	// changed is closed and replaced when the bundle changes.
	changed chan struct{}
}

// NewRotator returns a rotator configured by cfg.
func NewRotator(client kubernetes.Interface, cfg Config, log *slog.Logger, m Metrics) (*Rotator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, fmt.Errorf("%s certificates: no Kubernetes client", cfg.Purpose)
	}
	return &Rotator{client: client, cfg: cfg, hosts: slices.Clone(cfg.Hosts), log: log.With("secret", cfg.Secret.String()),
		m: m, now: time.Now, changed: make(chan struct{})}, nil
}

// GetCertificate serves the current certificate (tls.Config.GetCertificate).
func (r *Rotator) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert == nil {
		return nil, fmt.Errorf("%s certificates: none yet", r.cfg.Purpose)
	}
	return r.cert, nil
}

// Serving is the current serving certificate (with its chain) and key,
// PEM; nil before the first Sync.
func (r *Rotator) Serving() (certPEM, keyPEM []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.certPEM), slices.Clone(r.keyPEM)
}

// CABundle is the PEM bundle clients must trust (nil before the first
// Sync), and a channel closed when it or the serving certificate
// changes.
func (r *Rotator) CABundle() ([]byte, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bundle), r.changed
}

// Run syncs every CheckInterval until ctx ends.
func (r *Rotator) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.CheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.Sync(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn(r.cfg.Purpose+" certificates: sync failed; serving the current ones", "err", err)
		}
	}
}

// SyncUntilDone syncs until it succeeds or ctx ends (then failing with
// the last error), backing off from 250 ms to 5 s: a first certificate
// before whatever serves it starts.
func (r *Rotator) SyncUntilDone(ctx context.Context) error {
	delay := 250 * time.Millisecond
	for {
		err := r.Sync(ctx)
		if err == nil {
			return nil
		}
		r.log.Warn(r.cfg.Purpose+" certificates; retrying", "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s certificates: %w", r.cfg.Purpose, err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 5*time.Second)
	}
}

// Sync reads the Secret, rotates what is due (writing the Secret) and
// serves the result.
func (r *Rotator) Sync(ctx context.Context) error {
	secrets := r.client.CoreV1().Secrets(r.cfg.Secret.Namespace)
	for attempt := 0; ; attempt++ {
		s, err := secrets.Get(ctx, r.cfg.Secret.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
				return fmt.Errorf("get secret %s: %w (the manifests create it empty and let atoll-cloud get and update it)", r.cfg.Secret, err)
			}
			return fmt.Errorf("get secret %s: %w", r.cfg.Secret, err)
		}
		next, reasons, err := r.rotate(s.Data)
		if err != nil {
			return err
		}
		if len(reasons) == 0 {
			return r.load(s.Data)
		}
		upd := s.DeepCopy()
		upd.Data = next
		if upd.Type == "" {
			upd.Type = corev1.SecretTypeOpaque
		}
		_, err = secrets.Update(ctx, upd, metav1.UpdateOptions{FieldManager: wellknown.FieldManager})
		if apierrors.IsConflict(err) && attempt < 3 {
			continue // another replica rotated: adopt its result
		}
		if err != nil {
			return fmt.Errorf("update secret %s: %w", r.cfg.Secret, err)
		}
		if r.m.Rotations != nil {
			for _, why := range reasons {
				r.m.Rotations.WithLabelValues(why).Inc()
			}
		}
		r.log.Info(r.cfg.Purpose+" certificates rotated", "reasons", reasons)
		return r.load(next)
	}
}

// load serves the Secret's serving certificate and publishes its bundle.
func (r *Rotator) load(data map[string][]byte) error {
	cert, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("%s certificates: serving key pair: %w", r.cfg.Purpose, err)
	}
	if r.m.Expiry != nil {
		r.m.Expiry.Set(float64(cert.Leaf.NotAfter.Unix()))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cert = &cert
	servingChanged := !bytes.Equal(r.certPEM, data[corev1.TLSCertKey])
	r.certPEM, r.keyPEM = slices.Clone(data[corev1.TLSCertKey]), slices.Clone(data[corev1.TLSPrivateKeyKey])
	if servingChanged || !bytes.Equal(r.bundle, data[SecretCABundle]) {
		r.bundle = slices.Clone(data[SecretCABundle])
		close(r.changed)
		r.changed = make(chan struct{})
	}
	return nil
}

// Rotation reasons (the label of Metrics.Rotations).
const (
	rotateNewCA      = "ca"
	rotateServing    = "serving"
	rotateToCurrent  = "serving-to-new-ca"
	rotateDroppedOld = "ca-expired-dropped"
)

// Reasons are every rotation reason, to pre-create the metric's series.
var Reasons = []string{rotateNewCA, rotateServing, rotateToCurrent, rotateDroppedOld}

// rotate returns the Secret's next data and why, or no reasons when
// nothing is due.
func (r *Rotator) rotate(data map[string][]byte) (map[string][]byte, []string, error) {
	now := r.now()
	var reasons []string
	cas := ParseCerts(data[SecretCABundle])
	caKey := parseKey(data[SecretCAKey])
	// The current CA: the bundle's first, with its key.
	var ca *x509.Certificate
	if len(cas) > 0 && caKey != nil && keyMatches(cas[0], caKey) && cas[0].IsCA {
		ca = cas[0]
	}
	if ca == nil || due(ca, now) {
		cert, key, err := newCA(now, r.cfg.CALifetime, r.cfg.Purpose)
		if err != nil {
			return nil, nil, err
		}
		ca, caKey = cert, key
		cas = append([]*x509.Certificate{cert}, cas...)
		reasons = append(reasons, rotateNewCA)
	}
	// Keep the earlier CAs while they are valid: certificates they signed
	// may still be served.
	kept := cas[:1]
	for _, c := range cas[1:] {
		if now.Before(c.NotAfter) && !c.Equal(ca) {
			kept = append(kept, c)
		} else if !c.Equal(ca) {
			reasons = append(reasons, rotateDroppedOld)
		}
	}
	cas = kept

	serving, _ := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	var reissue string
	newCA := slices.Contains(reasons, rotateNewCA)
	switch leaf := serving.Leaf; {
	case leaf == nil, !r.names(leaf), !now.Before(leaf.NotAfter), !signedByAny(leaf, cas):
		reissue = rotateServing
	case due(leaf, now) && !newCA:
		// Due, but never from a CA this very step created: the clients
		// do not trust it yet. A due certificate has a third of its
		// life (at least three check intervals) left for the next case.
		reissue = rotateServing
	case leaf.CheckSignatureFrom(ca) != nil && now.Sub(ca.NotBefore) >= backdate+2*r.cfg.CheckInterval:
		// The new CA's bundle had time to reach the clients.
		reissue = rotateToCurrent
	}
	next := map[string][]byte{
		SecretCABundle:          encodeCerts(cas),
		SecretCAKey:             encodeKey(caKey),
		corev1.TLSCertKey:       data[corev1.TLSCertKey],
		corev1.TLSPrivateKeyKey: data[corev1.TLSPrivateKeyKey],
	}
	if reissue != "" {
		certPEM, keyPEM, err := issueServing(now, r.cfg.CertLifetime, ca, caKey, r.hosts, r.cfg.Purpose)
		if err != nil {
			return nil, nil, err
		}
		next[corev1.TLSCertKey], next[corev1.TLSPrivateKeyKey] = certPEM, keyPEM
		reasons = append(reasons, reissue)
	}
	return next, reasons, nil
}

// names reports whether leaf is valid for every host.
func (r *Rotator) names(leaf *x509.Certificate) bool {
	for _, h := range r.hosts {
		if leaf.VerifyHostname(h) != nil {
			return false
		}
	}
	return true
}

// due reports whether c is in the last third of its lifetime (or past
// it), its lifetime counted from its creation (NotBefore + backdate).
func due(c *x509.Certificate, now time.Time) bool {
	life := c.NotAfter.Sub(c.NotBefore) - backdate
	return now.After(c.NotAfter.Add(-life / 3))
}

func signedByAny(leaf *x509.Certificate, cas []*x509.Certificate) bool {
	for _, c := range cas {
		if leaf.CheckSignatureFrom(c) == nil {
			return true
		}
	}
	return false
}

func keyMatches(c *x509.Certificate, k *ecdsa.PrivateKey) bool {
	pub, ok := c.PublicKey.(*ecdsa.PublicKey)
	return ok && pub.Equal(&k.PublicKey)
}

func newCA(now time.Time, life time.Duration, purpose string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificates: ca key: %w", purpose, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "atoll-cloud-" + strings.ReplaceAll(purpose, " ", "-") + "-ca@" + now.UTC().Format(time.RFC3339)},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(life),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificates: ca: %w", purpose, err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// issueServing signs a serving certificate for hosts, valid for life but
// never past the CA.
func issueServing(now time.Time, life time.Duration, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string, purpose string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificates: serving key: %w", purpose, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if tmpl.NotAfter.After(ca.NotAfter) {
		tmpl.NotAfter = ca.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("%s certificates: serving: %w", purpose, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), encodeKey(key), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// ParseCerts parses every certificate of a PEM bundle, skipping what is
// not one.
func ParseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for len(data) > 0 {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
	return out
}

func encodeCerts(cs []*x509.Certificate) []byte {
	var out []byte
	for _, c := range cs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

func parseKey(data []byte) *ecdsa.PrivateKey {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil
	}
	k, err := x509.ParseECPrivateKey(b.Bytes)
	if err != nil {
		return nil
	}
	return k
}

func encodeKey(k *ecdsa.PrivateKey) []byte {
	der, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}
