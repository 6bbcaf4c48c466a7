package identity

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
)

// Kubernetes enrollment (KubernetesConfig): an atoll-edge pod enrolls its
// node with its pod-bound ServiceAccount token. atoll-cloud keeps the
// installation's shared enrollment credentials in a Secret that the
// atoll-edge DaemonSet mounts; a node links with them, sends its token,
// and atoll-cloud asks the apiserver (TokenReview) whose token it is: the
// atoll-edge ServiceAccount's, bound to a pod on the node the request
// names. Only then are the node's credentials issued.

// RoleEnroller is the role of the shared enrollment credentials.
const RoleEnroller Role = "enroller"

// Defaults of KubernetesConfig.
const (
	DefaultEnrollSecret   = "atoll-edge-enroll"
	DefaultEnrollAudience = "atoll"
	// EnrollCredsKey is the key of the credentials file in the Secret.
	EnrollCredsKey = "enroll.creds"
	// nodeNameExtra is the user extra the apiserver gives a pod-bound
	// ServiceAccount token: the node of the pod.
	nodeNameExtra = "authentication.kubernetes.io/node-name"
)

// KubernetesConfig configures Kubernetes enrollment.
type KubernetesConfig struct {
	// Secret holds the shared enrollment credentials (created empty by
	// the manifests; atoll-cloud fills it).
	Secret types.NamespacedName
	// ServiceAccount is atoll-edge's: only its tokens enroll.
	ServiceAccount types.NamespacedName
	// Audience the tokens must be issued for.
	Audience string
}

// DefaultKubernetesConfig is the production configuration in namespace ns.
func DefaultKubernetesConfig(ns string) KubernetesConfig {
	return KubernetesConfig{
		Secret:         types.NamespacedName{Namespace: ns, Name: DefaultEnrollSecret},
		ServiceAccount: types.NamespacedName{Namespace: ns, Name: "atoll-edge"},
		Audience:       DefaultEnrollAudience,
	}
}

// Validate names the first bad field.
func (c KubernetesConfig) Validate() error {
	switch {
	case c.Secret.Name == "" || c.Secret.Namespace == "":
		return errors.New("identity: kubernetes enrollment: no Secret for the enrollment credentials")
	case c.ServiceAccount.Name == "" || c.ServiceAccount.Namespace == "":
		return errors.New("identity: kubernetes enrollment: no ServiceAccount")
	case c.Audience == "":
		return errors.New("identity: kubernetes enrollment: no token audience")
	}
	return nil
}

// Kubernetes enrolls nodes by their pods' ServiceAccount tokens.
type Kubernetes struct {
	cfg    KubernetesConfig
	client kubernetes.Interface
}

// NewKubernetes returns the Kubernetes enrollment of cfg.
func NewKubernetes(cfg KubernetesConfig, client kubernetes.Interface) (*Kubernetes, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("identity: kubernetes enrollment: no Kubernetes client")
	}
	return &Kubernetes{cfg: cfg, client: client}, nil
}

// nodeOf asks the apiserver whose token this is and returns the node of
// the pod it is bound to; a token that is not atoll-edge's, not for the
// audience, expired, or not bound to a pod on a node is refused.
func (k *Kubernetes) nodeOf(ctx context.Context, token string) (string, error) {
	tr, err := k.client.AuthenticationV1().TokenReviews().Create(ctx, &authv1.TokenReview{
		Spec: authv1.TokenReviewSpec{Token: token, Audiences: []string{k.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token review: %w", err)
	}
	st := tr.Status
	want := "system:serviceaccount:" + k.cfg.ServiceAccount.Namespace + ":" + k.cfg.ServiceAccount.Name
	switch {
	case !st.Authenticated:
		return "", requestError{fmt.Errorf("the ServiceAccount token is not valid for audience %q: %s", k.cfg.Audience, st.Error)}
	case st.User.Username != want:
		return "", requestError{fmt.Errorf("the token is %s's, not %s's", st.User.Username, want)}
	case len(st.User.Extra[nodeNameExtra]) != 1:
		return "", requestError{errors.New("the token is not bound to a pod on a node (use a projected ServiceAccount token)")}
	}
	return st.User.Extra[nodeNameExtra][0], nil
}

// Enroller issues the shared enrollment credentials: a client or leaf
// connection that may only send Kubernetes enrollment requests and hear
// their replies. They prove nothing: the ServiceAccount token does.
func (i *Issuer) Enroller(pub string) (string, error) {
	var p jwt.Permissions
	p.Pub.Allow.Add(events.EnrollKubernetesWildcard)
	p.Sub.Allow.Add(events.EnrollInboxPrefix("*") + ".>")
	return i.user(RoleEnroller, "kubernetes", pub, 0, p, "bootstrap")
}

// ensureEnrollCreds fills the Secret with the shared enrollment
// credentials unless it holds valid ones of this installation.
func (s *Service) ensureEnrollCreds(ctx context.Context) error {
	k := s.kube
	secrets := k.client.CoreV1().Secrets(k.cfg.Secret.Namespace)
	sec, err := secrets.Get(ctx, k.cfg.Secret.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("identity: enrollment Secret %s: %w (the manifests create it empty and let atoll-cloud get and update it)", k.cfg.Secret, err)
	}
	if s.validEnrollCreds(sec.Data[EnrollCredsKey]) {
		return nil
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	pub, _ := kp.PublicKey()
	userJWT, err := s.issuer.Enroller(pub)
	if err != nil {
		return err
	}
	creds, err := FormatCreds(userJWT, kp)
	if err != nil {
		return err
	}
	upd := sec.DeepCopy()
	if upd.Data == nil {
		upd.Data = map[string][]byte{}
	}
	upd.Data[EnrollCredsKey] = creds
	if upd.Type == "" {
		upd.Type = corev1.SecretTypeOpaque
	}
	if _, err := secrets.Update(ctx, upd, metav1.UpdateOptions{FieldManager: wellknown.FieldManager}); err != nil {
		return fmt.Errorf("identity: enrollment Secret %s: %w", k.cfg.Secret, err)
	}
	s.log.Info("shared enrollment credentials written", "secret", k.cfg.Secret.String())
	return nil
}

// validEnrollCreds reports whether creds are enrollment credentials
// signed by this installation's keys.
func (s *Service) validEnrollCreds(creds []byte) bool {
	userJWT, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return false
	}
	c, err := jwt.DecodeUserClaims(userJWT)
	if err != nil {
		return false
	}
	return c.Issuer == pubOf(s.issuer.Keys().AccountSigning) && c.IssuerAccount == s.issuer.Keys().AccountKey() &&
		c.Tags.Contains("role:"+string(RoleEnroller))
}

// keepEnrollCreds writes the shared enrollment credentials until it
// succeeds once.
func (s *Service) keepEnrollCreds(ctx context.Context) {
	delay := time.Second
	for {
		err := s.ensureEnrollCreds(ctx)
		if err == nil || ctx.Err() != nil {
			return
		}
		s.log.Warn("shared enrollment credentials not written; retrying", "in", delay, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Minute)
	}
}

// handleEnrollKubernetes enrolls the node of the subject when the token
// is atoll-edge's ServiceAccount token bound to a pod on that node.
func (s *Service) handleEnrollKubernetes(r micro.Request) (any, error) {
	node, err := subjectNode(r.Subject(), ".k8s")
	if err != nil {
		return nil, badRequest("enroll: %w", err)
	}
	req, err := events.DecodeEnrollRequest(r.Data())
	if err != nil {
		return nil, badRequest("%w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), gateTimeout)
	defer cancel()
	on, err := s.kube.nodeOf(ctx, req.Token)
	if err != nil {
		var re requestError
		if errors.As(err, &re) {
			return nil, badRequest("enroll %s: %w", node, err)
		}
		return nil, fmt.Errorf("enroll %s: %w", node, err)
	}
	if !strings.EqualFold(on, node) {
		s.log.Warn("enrollment with another node's token refused", "edge", node, "token_node", on)
		return nil, badRequest("enroll %s: the token is of a pod on node %s", node, on)
	}
	unit, _ := s.assignedUnit(ctx, node)
	userJWT, err := s.IssueEdge(ctx, node, unit, req.Key)
	if err != nil {
		return nil, err
	}
	s.log.Info("node enrolled by its ServiceAccount token", "edge", node, "unit", unit, "key", req.Key)
	return EnrollReply{Node: node, JWT: userJWT}, nil
}
