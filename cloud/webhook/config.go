package webhook

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Default values of Config and RegistrationConfig.
const (
	DefaultAddr           = ":9443"
	DefaultCertDir        = "/etc/atoll/webhook"
	DefaultPath           = "/mutate"
	DefaultName           = "atoll-health"
	DefaultTimeoutSeconds = 2
	// DefaultRequestTimeout bounds one admission request on the server.
	DefaultRequestTimeout = 10 * time.Second
	// DefaultMaxRequestBytes fits an AdmissionReview carrying an object
	// and its old version at the apiserver's 3 MiB request limit each.
	DefaultMaxRequestBytes = 7 << 20
	// CertFile and KeyFile are the names of the serving certificate and key
	// in Config.CertDir (the layout of a kubernetes.io/tls Secret and of
	// controller-runtime's webhook server).
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	// DefaultCertSecret is the Secret of generated certificates, which
	// deploy/base/atoll-cloud.yaml creates empty.
	DefaultCertSecret = "atoll-cloud-webhook-certs"
	// DefaultCALifetime and DefaultCertLifetime are the generated CA's and
	// serving certificate's lifetimes; each is renewed in its last third.
	DefaultCALifetime   = 365 * 24 * time.Hour
	DefaultCertLifetime = 30 * 24 * time.Hour
	// DefaultCertCheckInterval is how often every replica re-reads the
	// certificate Secret (and renews what is due).
	DefaultCertCheckInterval = time.Minute
)

// Where the serving certificate comes from (Config.Certs).
const (
	// CertsGenerate: atoll-cloud generates a CA and a serving
	// certificate, keeps them in the Secret Config.CertSecret (shared by
	// the replicas), renews both before they expire and keeps the
	// caBundle of its MutatingWebhookConfiguration in sync.
	CertsGenerate = "generate"
	// CertsDir: tls.crt and tls.key are files in Config.CertDir (a
	// mounted kubernetes.io/tls Secret, reloaded when it changes); the
	// caBundle comes from RegistrationConfig.CABundle or CAFile.
	CertsDir = "dir"
	// CertsCertManager: as CertsDir, and the caBundle is left to
	// cert-manager's CA injector (annotation
	// cert-manager.io/inject-ca-from on the configuration): the
	// registration writes none.
	CertsCertManager = "cert-manager"
)

// SecretRef names a Secret.
type SecretRef struct {
	Namespace, Name string
}

// Config configures the webhook's HTTPS server.
type Config struct {
	// Addr is host:port to listen on (":0" for a random port).
	Addr string
	// Certs is where the serving certificate comes from: CertsGenerate,
	// CertsDir (also when empty) or CertsCertManager.
	Certs string
	// CertDir holds tls.crt and tls.key (CertsDir, CertsCertManager).
	// Rotated files are picked up without a restart.
	CertDir string
	// CertSecret holds the generated certificates (CertsGenerate; default
	// atoll-system/DefaultCertSecret).
	CertSecret SecretRef
	// CALifetime, CertLifetime and CertCheckInterval tune CertsGenerate
	// (defaults DefaultCALifetime, DefaultCertLifetime,
	// DefaultCertCheckInterval). The serving certificate must live at
	// least nine check intervals and at most a third of the CA's life.
	CALifetime, CertLifetime, CertCheckInterval time.Duration
	// Path is where the admission handler is served.
	Path string
	// ShutdownTimeout bounds a graceful stop when the caller's context has
	// no deadline (0: 10s).
	ShutdownTimeout time.Duration
	// RequestTimeout bounds reading a request and writing its answer
	// (0: DefaultRequestTimeout). The apiserver gives up after the
	// registration's TimeoutSeconds anyway.
	RequestTimeout time.Duration
	// MaxRequestBytes bounds a request body (0: DefaultMaxRequestBytes).
	MaxRequestBytes int64
}

// DefaultConfig is the production server configuration: atoll-cloud
// generates and rotates its certificates (CertsGenerate).
func DefaultConfig() Config {
	return Config{Addr: DefaultAddr, Certs: CertsGenerate, CertDir: DefaultCertDir, Path: DefaultPath, ShutdownTimeout: 10 * time.Second,
		RequestTimeout: DefaultRequestTimeout, MaxRequestBytes: DefaultMaxRequestBytes}.withDefaults()
}

func (c Config) withDefaults() Config {
	if c.Certs == "" {
		c.Certs = CertsDir
	}
	if c.CertSecret.Namespace == "" {
		c.CertSecret.Namespace = "atoll-system"
	}
	if c.CertSecret.Name == "" {
		c.CertSecret.Name = DefaultCertSecret
	}
	if c.CALifetime == 0 {
		c.CALifetime = DefaultCALifetime
	}
	if c.CertLifetime == 0 {
		c.CertLifetime = DefaultCertLifetime
	}
	if c.CertCheckInterval == 0 {
		c.CertCheckInterval = DefaultCertCheckInterval
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = DefaultMaxRequestBytes
	}
	return c
}

// Validate names the first field that is wrong. An empty Path is allowed and
// means DefaultPath.
func (c Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return fmt.Errorf("webhook: addr %q: %w", c.Addr, err)
	}
	d := c.withDefaults()
	switch d.Certs {
	case CertsDir, CertsCertManager:
		if c.CertDir == "" {
			return errors.New("webhook: cert dir is empty")
		}
	case CertsGenerate:
		switch {
		case d.CALifetime < 0 || d.CertLifetime < 0 || d.CertCheckInterval < 0:
			return errors.New("webhook: certificate lifetimes and check interval must not be negative")
		case 3*d.CertLifetime > d.CALifetime:
			// The CA is renewed with a third of its life left: a serving
			// certificate must fit in that, so it never outlives its CA.
			return fmt.Errorf("webhook: cert lifetime %s is more than a third of the ca lifetime %s", d.CertLifetime, d.CALifetime)
		case d.CertLifetime < 9*d.CertCheckInterval:
			return fmt.Errorf("webhook: cert lifetime %s is shorter than nine cert check intervals (%s)", d.CertLifetime, d.CertCheckInterval)
		}
	default:
		return fmt.Errorf("webhook: certs %q: want %s, %s or %s", c.Certs, CertsGenerate, CertsDir, CertsCertManager)
	}
	if c.Path != "" && !strings.HasPrefix(c.Path, "/") {
		return fmt.Errorf("webhook: path %q must start with /", c.Path)
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("webhook: shutdown timeout %s is negative", c.ShutdownTimeout)
	}
	if c.RequestTimeout < 0 {
		return fmt.Errorf("webhook: request timeout %s is negative", c.RequestTimeout)
	}
	if c.MaxRequestBytes < 0 {
		return fmt.Errorf("webhook: max request bytes %d is negative", c.MaxRequestBytes)
	}
	return nil
}

// ServiceRef is an in-cluster Service in front of the webhook server.
type ServiceRef struct {
	Namespace string
	Name      string
	// Port is the Service port (0: 443).
	Port int32
}

// RegistrationConfig describes the MutatingWebhookConfiguration that
// Register applies. Exactly one of URL and Service.Name must be set.
type RegistrationConfig struct {
	// Enabled makes Module register at start; Register ignores it.
	Enabled bool
	// Name of the MutatingWebhookConfiguration (default "atoll-health").
	Name string
	// UnitLabel is the node label key of a unit (default wellknown.LabelUnit);
	// only nodes that carry it are sent to the webhook.
	UnitLabel string
	// TimeoutSeconds is each webhook's timeout, 1..30 (default 2). The
	// failure policy is Ignore except for the guard (WebhookGuard), so a
	// slow webhook delays writes by at most this much and blocks only the
	// node lifecycle controller's eviction taint on protected nodes.
	TimeoutSeconds int32
	// FailOpen drops the guard: while no replica answers, the node
	// lifecycle controller may taint a protected node NoExecute and its
	// pods are evicted after their toleration. Off by default.
	FailOpen bool
	// GuardUsers are the identities of the node lifecycle controller, whose
	// eviction taint the guard stops on protected nodes (default
	// DefaultGuardUsers).
	GuardUsers []string
	// URL is the webhook's https URL including the path, for a webhook
	// outside the cluster (or on the apiserver's host in tests).
	URL string
	// Service is the Service in front of the webhook, with Path.
	Service ServiceRef
	// Path is the request path at the Service (default "/mutate").
	Path string
	// CABundle is the PEM CA that signs the serving certificate.
	CABundle []byte
	// CAFile is read into CABundle when CABundle is empty.
	CAFile string
	// ProtectedNamespace is where the health service keeps the protected
	// set (its ConfigMaps), which the pod readiness policy reads: Register
	// also applies that policy and its binding there. Empty: no policy.
	ProtectedNamespace string
	// CAInjected leaves the caBundle to someone else (cert-manager's CA
	// injector): Register writes none, and neither CABundle nor CAFile is
	// needed. Module sets it with CertsCertManager, and fills CABundle
	// itself with CertsGenerate.
	CAInjected bool
}

// DefaultGuardUsers are the node lifecycle controller's identities: its
// service account when kube-controller-manager runs with
// --use-service-account-credentials (kubeadm and most distributions), and
// kube-controller-manager's own user otherwise.
var DefaultGuardUsers = []string{"system:serviceaccount:kube-system:node-controller", "system:kube-controller-manager"}

// DefaultRegistrationConfig returns the defaults; the client config (URL or
// Service, CA) is left to the deployment.
func DefaultRegistrationConfig() RegistrationConfig {
	return RegistrationConfig{}.withDefaults()
}

func (c RegistrationConfig) withDefaults() RegistrationConfig {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.UnitLabel == "" {
		c.UnitLabel = wellknown.LabelUnit
	}
	if c.TimeoutSeconds == 0 {
		c.TimeoutSeconds = DefaultTimeoutSeconds
	}
	if c.Path == "" {
		c.Path = DefaultPath
	}
	if len(c.GuardUsers) == 0 {
		c.GuardUsers = DefaultGuardUsers
	}
	if c.Service.Name != "" && c.Service.Port == 0 {
		c.Service.Port = 443
	}
	return c
}

// ValidateFor validates c for a server configured by server: with
// CertsGenerate or CertsCertManager no CA is needed (it is generated, or
// injected by cert-manager).
func (c RegistrationConfig) ValidateFor(server Config) error {
	if server.withDefaults().Certs != CertsDir {
		c.CAInjected = true
	}
	return c.Validate()
}

// Validate names the first field that is wrong. Zero values that have a
// default are allowed.
func (c RegistrationConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.URL == "" && c.Service.Name == "":
		return errors.New("webhook registration: set url or service name")
	case c.URL != "" && c.Service.Name != "":
		return errors.New("webhook registration: url and service name are exclusive")
	case c.TimeoutSeconds < 1 || c.TimeoutSeconds > 30:
		return fmt.Errorf("webhook registration: timeout seconds %d is outside 1..30", c.TimeoutSeconds)
	case len(c.CABundle) == 0 && c.CAFile == "" && !c.CAInjected:
		return errors.New("webhook registration: ca bundle and ca file are empty")
	case !strings.HasPrefix(c.Path, "/"):
		return fmt.Errorf("webhook registration: path %q must start with /", c.Path)
	}
	for _, u := range c.GuardUsers {
		if strings.TrimSpace(u) == "" {
			return errors.New("webhook registration: guard users: empty user name")
		}
	}
	if c.URL != "" {
		u, err := url.Parse(c.URL)
		if err != nil {
			return fmt.Errorf("webhook registration: url %q: %w", c.URL, err)
		}
		if u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("webhook registration: url %q must be https://host[:port]/path", c.URL)
		}
	}
	if c.Service.Name != "" {
		if c.Service.Namespace == "" {
			return errors.New("webhook registration: service namespace is empty")
		}
		if c.Service.Port < 1 || c.Service.Port > 65535 {
			return fmt.Errorf("webhook registration: service port %d is outside 1..65535", c.Service.Port)
		}
	}
	return nil
}
