package enrollment_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/enroll"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/promtest"
)

// TestKubernetesEnrollment is what an atoll-edge pod does, against a real
// apiserver (its TokenReview) and hub: atoll-cloud fills the empty
// enrollment Secret; a node with no credentials links with them, sends
// the projected token of its pod (atoll-edge's ServiceAccount, audience
// atoll, bound to a pod on the node) and links with credentials of its
// own. Presented by anyone holding the shared credentials, each wrong
// token is refused with the reason, and counted: another node's pod's, a
// token for another audience, another ServiceAccount's, one bound to no
// pod. The shared credentials reach nothing else: not the bootstrap
// subject, not a node's inbox.
func TestKubernetesEnrollment(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	log := natstest.Logger(t, slog.LevelWarn)
	cluster := kubetest.Start(t)
	kube := cluster.Client()
	if err := cluster.CreateNamespace(ctx, "atoll-system"); err != nil {
		t.Fatal(err)
	}
	kcfg := identity.DefaultKubernetesConfig("atoll-system")
	if _, err := kube.CoreV1().Secrets("atoll-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: kcfg.Secret.Name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for _, p := range []struct{ sa, node string }{{"atoll-edge", "n1"}, {"atoll-edge", "n2"}, {"other", "n1"}} {
		pods[p.sa+"/"+p.node] = boundPod(ctx, t, kube, p.sa, p.node)
	}

	h := natstest.Hub(t)
	k, err := identity.NewKubernetes(kcfg, kube)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	ids, _ := identityOnHub(ctx, t, h, log, identity.NewMetrics(reg), k)

	dir := t.TempDir()
	shared := filepath.Join(dir, "enroll.creds")
	poll.Eventually(t, 30*time.Second, func() error {
		s, err := kube.CoreV1().Secrets("atoll-system").Get(ctx, kcfg.Secret.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(s.Data[identity.EnrollCredsKey]) == 0 {
			return errors.New("the enrollment Secret is still empty")
		}
		return os.WriteFile(shared, s.Data[identity.EnrollCredsKey], 0o600)
	})

	// The node n1, as atoll-edge runs it in its pod.
	tokenFile, credsFile := filepath.Join(dir, "token"), filepath.Join(dir, "node.creds")
	if err := os.WriteFile(tokenFile, []byte(podToken(ctx, t, kube, pods["atoll-edge/n1"], "atoll")), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := nodeConfig("n1", h.LeafURLs())
	cfg.CredsFile, cfg.BootstrapFile, cfg.EnrollCredsFile = credsFile, filepath.Join(dir, "absent.creds"), shared
	n, _ := enrollingNode(ctx, t, log, cfg, enroll.Config{ServiceAccountTokenFile: tokenFile}, nil)
	poll.Eventually(t, 30*time.Second, func() error {
		if n.EnrollingByServiceAccount() || !n.Status().HubConnected {
			return errors.New("not linked with credentials of its own yet")
		}
		return nil
	})
	if key, ok := ids.NodeKey("n1"); !ok || key != n.PublicKey() {
		t.Fatalf("the cloud knows key %q, the node links with %q", key, n.PublicKey())
	}
	if _, err := os.Stat(credsFile); err != nil {
		t.Fatalf("the enrolled credentials are not kept: %v", err)
	}

	// Anyone with the shared credentials, with a wrong token.
	nc, err := nats.Connect(h.ClientConfig().URLs[0], nats.UserCredentials(shared), nats.CustomInboxPrefix(events.EnrollInboxPrefix("n2")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	noAPIToken, err := kube.CoreV1().ServiceAccounts("atoll-system").CreateToken(ctx, "atoll-edge",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{Audiences: []string{"atoll"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, token, want string }{
		{"another node's pod", podToken(ctx, t, kube, pods["atoll-edge/n1"], "atoll"), "the token is of a pod on node n1"},
		{"another audience", podToken(ctx, t, kube, pods["atoll-edge/n2"], "https://kubernetes.default.svc"), `not valid for audience "atoll"`},
		{"another ServiceAccount", podToken(ctx, t, kube, pods["other/n1"], "atoll"), "not system:serviceaccount:atoll-system:atoll-edge's"},
		{"bound to no pod", noAPIToken.Status.Token, "not bound to a pod on a node"},
	} {
		kp, _ := nkeys.CreateUser()
		pub, _ := kp.PublicKey()
		subj, _ := events.EnrollKubernetesSubject("n2")
		req, _ := json.Marshal(events.EnrollRequest{Token: tc.token, Key: pub})
		msg, err := nc.Request(subj, req, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if desc := msg.Header.Get(micro.ErrorHeader); !strings.Contains(desc, tc.want) {
			t.Errorf("%s: %q %s, want a refusal saying %q", tc.name, desc, msg.Data, tc.want)
		}
	}
	if _, ok := ids.NodeKey("n2"); ok {
		t.Error("n2 was enrolled")
	}
	if got := promtest.Counter(t, reg, "atoll_identity_requests_refused_total", map[string]string{"endpoint": "enroll-k8s"}); got != 4 {
		t.Errorf("refused enroll-k8s requests counted %v, want 4", got)
	}

	// Nothing else: the bootstrap subject, a node's inbox.
	errs := make(chan error, 4)
	other, err := nats.Connect(h.ClientConfig().URLs[0], nats.UserCredentials(shared),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	if _, err := other.Subscribe(events.InboxPrefix("n1")+".>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	_ = other.Publish("atoll.enroll.n2", []byte("{}"))
	_ = other.Flush()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("want a permissions violation, got %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the shared credentials subscribed to a node's inbox or published to the bootstrap subject")
		}
	}
}

// boundPod creates namespace atoll-system's ServiceAccount sa (if new) and
// a pod of it on node (no kubelet runs it: the token binding needs only
// the object).
func boundPod(ctx context.Context, t *testing.T, kube kubernetes.Interface, sa, node string) *corev1.Pod {
	t.Helper()
	_, err := kube.CoreV1().ServiceAccounts("atoll-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	p, err := kube.CoreV1().Pods("atoll-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sa + "-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa, AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "agent", Image: "atoll-edge"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// podToken is a token of pod's ServiceAccount for audience, bound to the
// pod: what the kubelet projects into it.
func podToken(ctx context.Context, t *testing.T, kube kubernetes.Interface, pod *corev1.Pod, audience string) string {
	t.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{Audiences: []string{audience},
			BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}
