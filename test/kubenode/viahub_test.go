package kubenode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/promtest"
)

// TestRealNodeThroughTheHub runs a real node whose only way to
// kube-apiserver is its leaf link to the hub: its atoll-edge agent (a host
// service, the real binary) forwards the local API endpoint's connections
// (--apiserver-via=hub) to a tunnel server replica, which relays them to
// kube-apiserver; the node's own packets to kube-apiserver are dropped.
// The node registers and runs a pod with a ConfigMap, a Secret and a
// projected token, kube-proxy serves its Service, and after a power cut
// with the site cut off (hub included) the pod serves again at its
// address and the node reports it once the link is back.
func TestRealNodeThroughTheHub(t *testing.T) {
	const netN = 7
	if err := kubenode.Prerequisites(); err != nil {
		t.Skip(err)
	}
	h := natstest.Hub(t, func(c *hub.Config) { c.Host = "0.0.0.0" }) // the nodes reach it on the bridge
	leafURL := "nats-leaf://" + net.JoinHostPort(kubenode.HostIP(netN), h.LeafURL().Port())
	cluster := kubetest.Start(t, append(kubenode.ClusterOptions(netN), kubetest.WithTolerationSeconds(300, 300))...)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	// A tunnel replica, as in atoll-cloud with --tunnel-apiserver.
	nc, err := h.Connect("tunnel")
	if err != nil {
		t.Fatal(err)
	}
	cfg := tunnel.DefaultConfig()
	cfg.APIServer = strings.TrimPrefix(cluster.APIServerURL(), "https://")
	reg := prometheus.NewRegistry()
	srv, err := tunnel.New(cfg, tunnel.Names{}, tunnel.NewMetrics(reg), natstest.Logger(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()); nc.Close() })

	// kube-proxy reads Services and EndpointSlices as the node, through
	// the local API endpoint.
	client := cluster.Client()
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nodes-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:nodes"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	fleet := kubenode.StartForTest(t, cluster, kubenode.Config{Net: netN, LocalAPI: true, KeepPodIPs: true, LocalAPIViaHub: func(string) bool { return true },
		HostAgent: hubAgent(t, h, leafURL, "--tunnel-apiserver-listen="+kubenode.HubForwardAddr)})
	node, err := fleet.Add(ctx, "edge-1")
	if err != nil {
		t.Fatalf("%v\n%s", err, node.LogTails(30))
	}

	// The node's way to kube-apiserver is the hub's: a direct one is
	// dropped, and the replica relayed its connections.
	apiHost := net.JoinHostPort(node.HostIP(), cluster.APIServerURL()[strings.LastIndex(cluster.APIServerURL(), ":")+1:])
	if out, err := node.Exec(ctx, "curl", "-sSk", "--max-time", "2", "https://"+apiHost+"/readyz"); err == nil {
		t.Fatalf("the node reached kube-apiserver directly: %s", out)
	}
	if n := promtest.Counter(t, reg, "atoll_tunnel_server_apiserver_connections_total", map[string]string{"result": "ok"}); n < 1 {
		t.Fatalf("the replica relayed %v connections to kube-apiserver", n)
	}

	first := startHello(ctx, t, cluster, fleet, node)
	t.Logf("pod hello Ready at %s, the node reaching kube-apiserver through the hub only", first.Status.PodIP)
	t.Run("service through kube-proxy", func(t *testing.T) { helloService(ctx, t, client, node) })
	t.Run("power cut and boot offline", func(t *testing.T) { _ = bootOffline(ctx, t, cluster, node, first) })
}

// hubAgent is a kubenode HostAgent: atoll-edge linked to h at leafURL
// with credentials h issues for the node (no unit), its state on the
// node's disk, and extra flags.
func hubAgent(tb testing.TB, h *hub.Hub, leafURL string, extra ...string) func(*kubenode.Node) ([]string, []string, error) {
	credsDir := tb.TempDir()
	var mu sync.Mutex
	creds := map[string]string{}
	return func(n *kubenode.Node) ([]string, []string, error) {
		mu.Lock()
		defer mu.Unlock()
		if creds[n.Name] == "" {
			dir := filepath.Join(credsDir, n.Name)
			path, err := "", os.MkdirAll(dir, 0o700)
			if err == nil {
				path, err = natstest.WriteCreds(dir, h.Issuer(), func(_ *identity.Issuer, pub string) (string, error) {
					return h.IssueEdge(n.Name, "", pub)
				})
			}
			if err != nil {
				return nil, nil, fmt.Errorf("credentials of %s: %w", n.Name, err)
			}
			creds[n.Name] = path
		}
		return append([]string{"--node-name=" + n.Name, "--hub-url=" + leafURL, "--hub-domain=" + h.Domain(),
			"--creds-file=" + creds[n.Name], "--internal-ip=" + n.IP, "--route-host=" + n.IP,
			"--state-dir=/var/lib/atoll", "--log-format=text"}, extra...), nil, nil
	}
}
