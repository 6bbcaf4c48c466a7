package webhook

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
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Keys of the certificate Secret (CertsGenerate).
const (
	// SecretCABundle holds the CAs the apiserver must trust, PEM, the
	// current one first, then earlier ones until they expire.
	SecretCABundle = "ca.crt"
	// SecretCAKey is the current CA's private key.
	SecretCAKey = "ca.key"
)

// backdate is how far before its creation a certificate is valid, for
// clocks a little behind ours.
const backdate = time.Minute

// Rotator generates the webhook's CA and serving certificate, keeps them
// in one Secret that every replica shares, and rotates both before they
// expire (CertsGenerate). A rotated CA is added to the bundle beside the
// old one first; the serving certificate moves to it only once the new
// bundle had time to reach the apiserver (two check intervals), so the
// apiserver trusts every certificate a replica serves throughout. Writes
// are updates with the Secret's resourceVersion: when two replicas rotate
// at once, one wins and the other adopts its result.
type Rotator struct {
	client kubernetes.Interface
	cfg    Config
	hosts  []string
	log    *slog.Logger
	m      *metrics
	now    func() time.Time

	mu     sync.Mutex
	cert   *tls.Certificate
	bundle []byte
	// changed is closed and replaced when the bundle changes.
	changed chan struct{}
}

// NewRotator returns a rotator for the serving names hosts (DNS names or
// IP addresses), configured by cfg's CertSecret and lifetimes.
func NewRotator(client kubernetes.Interface, cfg Config, hosts []string, log *slog.Logger, m *metrics) (*Rotator, error) {
	cfg = cfg.withDefaults()
	if client == nil {
		return nil, errNoClient
	}
	if len(hosts) == 0 {
		return nil, errors.New("webhook certificates: no host names for the serving certificate")
	}
	if m == nil {
		m = newMetrics(nil)
	}
	return &Rotator{client: client, cfg: cfg, hosts: slices.Clone(hosts), log: log.With("secret", cfg.CertSecret.Namespace+"/"+cfg.CertSecret.Name),
		m: m, now: time.Now, changed: make(chan struct{})}, nil
}

// GetCertificate serves the current certificate (tls.Config.GetCertificate).
func (r *Rotator) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert == nil {
		return nil, errors.New("webhook certificates: none yet")
	}
	return r.cert, nil
}

// CABundle is the PEM bundle the apiserver must trust (nil before the
// first Sync), and a channel closed when it changes.
func (r *Rotator) CABundle() ([]byte, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bundle), r.changed
}

// Run syncs every CertCheckInterval until ctx ends.
func (r *Rotator) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.CertCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.Sync(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("webhook certificates: sync failed; serving the current ones", "err", err)
		}
	}
}

// Sync reads the Secret, rotates what is due (writing the Secret) and
// serves the result.
func (r *Rotator) Sync(ctx context.Context) error {
	secrets := r.client.CoreV1().Secrets(r.cfg.CertSecret.Namespace)
	for attempt := 0; ; attempt++ {
		s, err := secrets.Get(ctx, r.cfg.CertSecret.Name, metav1.GetOptions{})
		if err != nil {
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
				return fmt.Errorf("get secret %s/%s: %w (deploy/base/atoll-cloud.yaml creates it empty and lets atoll-cloud get and update it)",
					r.cfg.CertSecret.Namespace, r.cfg.CertSecret.Name, err)
			}
			return fmt.Errorf("get secret %s/%s: %w", r.cfg.CertSecret.Namespace, r.cfg.CertSecret.Name, err)
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
			return fmt.Errorf("update secret %s/%s: %w", r.cfg.CertSecret.Namespace, r.cfg.CertSecret.Name, err)
		}
		for _, why := range reasons {
			r.m.rotations.WithLabelValues(why).Inc()
		}
		r.log.Info("webhook certificates rotated", "reasons", reasons)
		return r.load(next)
	}
}

// load serves the Secret's serving certificate and publishes its bundle.
func (r *Rotator) load(data map[string][]byte) error {
	cert, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return fmt.Errorf("webhook certificates: serving key pair: %w", err)
	}
	r.m.certExpiry.Set(float64(cert.Leaf.NotAfter.Unix()))
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cert = &cert
	if !bytes.Equal(r.bundle, data[SecretCABundle]) {
		r.bundle = slices.Clone(data[SecretCABundle])
		close(r.changed)
		r.changed = make(chan struct{})
	}
	return nil
}

// Rotation reasons (label of atoll_webhook_cert_rotations_total).
const (
	rotateNewCA      = "ca"
	rotateServing    = "serving"
	rotateToCurrent  = "serving-to-new-ca"
	rotateDroppedOld = "ca-expired-dropped"
)

// rotate returns the Secret's next data and why, or no reasons when
// nothing is due.
func (r *Rotator) rotate(data map[string][]byte) (map[string][]byte, []string, error) {
	now := r.now()
	var reasons []string
	cas := parseCerts(data[SecretCABundle])
	caKey := parseKey(data[SecretCAKey])
	// The current CA: the bundle's first, with its key.
	var ca *x509.Certificate
	if len(cas) > 0 && caKey != nil && keyMatches(cas[0], caKey) && cas[0].IsCA {
		ca = cas[0]
	}
	if ca == nil || due(ca, now) {
		cert, key, err := newCA(now, r.cfg.CALifetime)
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
		// Due, but never from a CA this very step created: the apiserver
		// does not trust it yet. A due certificate has a third of its
		// life (at least three check intervals) left for the next case.
		reissue = rotateServing
	case leaf.CheckSignatureFrom(ca) != nil && now.Sub(ca.NotBefore) >= backdate+2*r.cfg.CertCheckInterval:
		// The new CA's bundle had time to reach the apiserver.
		reissue = rotateToCurrent
	}
	next := map[string][]byte{
		SecretCABundle:          encodeCerts(cas),
		SecretCAKey:             encodeKey(caKey),
		corev1.TLSCertKey:       data[corev1.TLSCertKey],
		corev1.TLSPrivateKeyKey: data[corev1.TLSPrivateKeyKey],
	}
	if reissue != "" {
		certPEM, keyPEM, err := issueServing(now, r.cfg.CertLifetime, ca, caKey, r.hosts)
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

func newCA(now time.Time, life time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("webhook certificates: ca key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "atoll-cloud-webhook-ca@" + now.UTC().Format(time.RFC3339)},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(life),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("webhook certificates: ca: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

// issueServing signs a serving certificate for hosts, valid for life but
// never past the CA.
func issueServing(now time.Time, life time.Duration, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("webhook certificates: serving key: %w", err)
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
		return nil, nil, fmt.Errorf("webhook certificates: serving: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), encodeKey(key), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func parseCerts(data []byte) []*x509.Certificate {
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
