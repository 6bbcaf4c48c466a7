package tunnel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/edge/localapi"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestAPIServerViaHub: node n1's local API endpoint with
// --apiserver-via=hub reaches a real kube-apiserver only through the
// agent's forward, the node's leaf link and a tunnel replica. TLS runs end
// to end: kube-apiserver authenticates the node by the certificate the
// endpoint holds (the replicas never see it). A silent cut of the leaf
// link (packets dropped) turns the endpoint to its cache; the link back
// turns it online again.
func TestAPIServerViaHub(t *testing.T) {
	kc := kubetest.Start(t)
	host := strings.TrimPrefix(kc.APIServerURL(), "https://")
	r := setupRig(t, rigOptions{kubelet: echoServer(t), res: tunnel.Names{}, apiserver: host})
	ctx := context.Background()
	if _, err := kc.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	cfg := localapi.Default()
	cfg.Listen, cfg.Dir = "127.0.0.1:0", t.TempDir()
	cfg.APIServer, cfg.CAFile = kc.APIServerURL(), kc.CAFile()
	cfg.CertFile, cfg.KeyFile = nodeCredentials(t, kc, "n1")
	cfg.Via, cfg.HubForward = localapi.ViaHub, r.agent.APIServerAddr().String()
	cfg.Timeout, cfg.ProbeInterval, cfg.FlushInterval = time.Second, 200*time.Millisecond, 100*time.Millisecond
	s, err := localapi.New(cfg, reg, natstest.Logger(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("local API stopped: %v", err)
		}
	})
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + s.Addr(), UserAgent: "kubelet/v1.36.3", QPS: -1, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}

	// kube-apiserver sees the node itself.
	review := func() (string, error) {
		rv, err := c.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		return rv.Status.UserInfo.Username, err
	}
	poll.Eventually(t, 20*time.Second, func() error {
		user, err := review()
		if err == nil && user != "system:node:n1" {
			t.Fatalf("kube-apiserver authenticated %q through the hub, want system:node:n1", user)
		}
		return err
	})
	if _, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := counterVec(t, r.agentReg, "atoll_tunnel_agent_apiserver_connections_total", "result", "ok"); n < 1 {
		t.Fatalf("agent counted %v connections through the hub", n)
	}
	relayed := 0.0
	for _, sr := range r.serverRegs {
		relayed += counterVec(t, sr, "atoll_tunnel_server_apiserver_connections_total", "result", "ok")
	}
	if relayed < 1 {
		t.Fatalf("the replicas counted %v connections to kube-apiserver", relayed)
	}

	// Packets of the leaf link dropped silently: the endpoint answers from
	// what the kubelet read, and refuses writes as not sent.
	r.proxy.Stall()
	poll.Eventually(t, 30*time.Second, func() error {
		if v := gauge(t, reg, "atoll_localapi_apiserver_reachable"); v != 0 {
			return fmt.Errorf("endpoint reports kube-apiserver reachable over a dead leaf link")
		}
		return nil
	})
	if n, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil || n.Name != "n1" {
		t.Fatalf("Node n1 from the cache, leaf link cut: %v", err)
	}
	if _, err := review(); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("a write with the leaf link cut: %v, want 503", err)
	}

	// The link back: the endpoint goes online through the hub again.
	r.proxy.Restore()
	poll.Eventually(t, 60*time.Second, func() error {
		if v := gauge(t, reg, "atoll_localapi_apiserver_reachable"); v != 1 {
			return fmt.Errorf("endpoint still offline")
		}
		_, err := review()
		return err
	})
}

// TestAPIServerViaHubRefusals: what a node may not get, and what it hears
// when nothing can serve it.
func TestAPIServerViaHubRefusals(t *testing.T) {
	apiserver := echoServer(t) // stands in for kube-apiserver: bytes only
	r := setupRig(t, rigOptions{kubelet: echoServer(t), res: tunnel.Names{}, apiserver: apiserver,
		first: func(c *tunnel.Config) { c.APIServerPerNode = 1 }})
	subj, err := events.APIServerDialSubject("n1")
	if err != nil {
		t.Fatal(err)
	}
	ask := func(token string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		var reply atollv1.APIServerDialed
		return events.Request(ctx, r.agentNC, subj, &atollv1.APIServerDial{Node: "n1", Token: token}, &reply)
	}
	code := func(err error) int {
		var se *events.ServiceError
		if !errors.As(err, &se) {
			return 0
		}
		return se.Code
	}
	// The replicas' interest reaches the node's server over the leaf link
	// shortly after they start.
	poll.Eventually(t, 10*time.Second, func() error {
		if err := ask(tunnelproto.NewSessionID()); errors.Is(err, nats.ErrNoResponders) {
			return err
		}
		return nil
	})

	t.Run("a connection through the forward", func(t *testing.T) {
		c, err := net.Dial("tcp", r.agent.APIServerAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		echo(t, c, 1<<20, nil)
	})
	t.Run("a session nobody waits for", func(t *testing.T) {
		err := ask(tunnelproto.NewSessionID())
		if code(err) != events.CodeUnavailable || !strings.Contains(err.Error(), "no connection to kube-apiserver waits on node n1") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a request in another node's name", func(t *testing.T) {
		var reply atollv1.APIServerDialed
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := events.Request(ctx, r.agentNC, subj, &atollv1.APIServerDial{Node: "n2", Token: "t"}, &reply)
		if code(err) != events.CodeBadRequest {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no token", func(t *testing.T) {
		if err := ask(""); code(err) != events.CodeBadRequest {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("over the limit per node", func(t *testing.T) {
		// Replica 1 relays without a limit: stop it, so that replica 0
		// (at most one connection of n1) answers.
		if err := r.servers[1].Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Its endpoint drains: until the hub has its unsubscription, the
		// hub may route a request to it, answered "shutting down". The
		// hub has it once a flush behind it returns.
		if err := r.serverNCs[1].Flush(); err != nil {
			t.Fatal(err)
		}
		held, err := net.Dial("tcp", r.agent.APIServerAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		if _, err := held.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(held, make([]byte, 1)); err != nil {
			t.Fatalf("the held connection: %v", err)
		}
		err = ask(tunnelproto.NewSessionID())
		if code(err) != events.CodeTooMany || !strings.Contains(err.Error(), "--tunnel-apiserver-per-node") {
			t.Fatalf("got %v", err)
		}
		if n := counterVec(t, r.serverRegs[0], "atoll_tunnel_server_apiserver_connections_total", "result", "over_limit"); n != 1 {
			t.Fatalf("over_limit counted %v times", n)
		}
	})
	t.Run("no replica relays", func(t *testing.T) {
		if err := r.servers[0].Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		// Once the node's server has heard that no replica is left, a
		// connection is closed at once, and counted.
		poll.Eventually(t, 10*time.Second, func() error {
			if err := ask("t"); !errors.Is(err, nats.ErrNoResponders) {
				return fmt.Errorf("got %v", err)
			}
			return nil
		})
		c, err := net.Dial("tcp", r.agent.APIServerAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.ReadAll(c); err != nil {
			t.Fatal(err)
		}
		poll.Eventually(t, 10*time.Second, func() error {
			if n := counterVec(t, r.agentReg, "atoll_tunnel_agent_apiserver_connections_total", "result", "no_relay"); n != 1 {
				return fmt.Errorf("no_relay counted %v times", n)
			}
			return nil
		})
	})
}

// nodeCredentials writes a client certificate of system:node:<name> and
// returns its files.
func nodeCredentials(t testing.TB, kc *kubetest.Cluster, name string) (certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	cert, key, err := kc.IssueClientCert("system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "node.crt"), filepath.Join(dir, "node.key")
	for f, b := range map[string][]byte{certFile: cert, keyFile: key} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}
