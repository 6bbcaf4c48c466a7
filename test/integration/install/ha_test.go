package install_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/podbed"
)

// haNet is TestAtollAsPodsHA's kubenode fleet (bridge kn6).
const haNet = 6

// TestAtollAsPodsHA installs the ha overlay as a user does, on real
// nodes with the cluster DNS: three nats-server pods (the hub, routed to
// each other by their StatefulSet's DNS names, R3 streams) and two
// atoll-cloud replicas on two cloud nodes, the Secrets made with
// `atoll-cloud hub-trust` as the overlay's header says; unit a's three
// edge nodes run atoll-edge, which enrolls by itself. Then:
//   - every pod is Ready, every node holds credentials of its own, each
//     hub server routes to the other two and requires TLS on its leaf
//     listener with the certificate atoll-cloud generated (verified with
//     the CA bundle it published, under the edges' name), `atoll status`
//     says SAFE;
//   - scenario 1 with Atoll's own failures on top: a node's link to the
//     cloud silently cut, and 5 s later the atoll-cloud replica holding
//     the leader Lease and one hub server killed with SIGKILL: no
//     NoExecute taint in any watch event, the node's pod kept, its
//     endpoint ready and answering at every poll past the toleration;
//     the killed containers come back and, healed, `atoll status` says
//     SAFE again;
//   - the agents given a kubelet token (--kubelet-token-file, a projected
//     ServiceAccount token) without its grant: every kubelet refuses it,
//     `atoll status` says DEGRADED and names the fix, no node is
//     protected; the grant (get nodes/healthz) makes it SAFE again;
//   - the leaf CA replaced at once as the operator guide says (the
//     Secret's data removed): atoll-cloud writes a new CA and certificate,
//     every hub server serves the new one (the kubelet updates the mounted
//     files, hub-leaf-reloader signals the server), and after a hub
//     server is killed its edges link again, verifying it with the new
//     bundle: SAFE.
func TestAtollAsPodsHA(t *testing.T) {
	if err := kubenode.Prerequisites(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	inst := install(ctx, t, podbed.Options{Net: haNet, Shape: podbed.ShapeHA,
		Units: map[string][]string{"a": {"edge-a1", "edge-a2", "edge-a3"}}})
	bed, client := inst.bed, inst.client
	hubs, err := client.CoreV1().Pods("atoll-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=atoll-hub"})
	if err != nil {
		t.Fatal(err)
	}
	bundle := leafCABundle(ctx, t, inst)
	for _, p := range hubs.Items {
		if routes := hubRoutes(ctx, t, p.Status.PodIP); len(routes) != 2 {
			t.Errorf("hub server %s on %s routes to %v, want the two others", p.Name, p.Spec.NodeName, routes)
		}
		if err := leafServes(p.Status.PodIP, bundle); err != nil {
			t.Errorf("hub server %s: %v", p.Name, err)
		}
	}
	t.Logf("atoll status:\n%s", inst.atollStatus())

	inst.apply(webGrid(bed.Fleet.Image("hello"), 3, ""))
	web := inst.waitWeb(map[string]string{"edge-a1": "a", "edge-a2": "a", "edge-a3": "a"})
	svc := inst.serviceIP("web-svc")
	client2 := web["edge-a2"]
	inst.eventually(time.Minute, func() error { return inst.servedInUnit(client2, svc, "web-a-") })

	a1 := bed.Edges["edge-a1"]
	taints := watchNoExecute(ctx, t, client, a1.Name)
	cutFrom := []string{kubenode.HostIP(haNet)}
	for _, c := range bed.Clouds {
		cutFrom = append(cutFrom, c.IP, c.PodCIDR)
	}
	if err := a1.Cut(cutFrom...); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	time.Sleep(5 * time.Second)
	lease, err := client.CoordinationV1().Leases("atoll-system").Get(ctx, "atoll-cloud", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		t.Fatalf("atoll-cloud's leader Lease: %v", err)
	}
	leader := *lease.Spec.HolderIdentity
	killProcess(t, "atoll-cloud", "ATOLL_LEADER_ELECTION_IDENTITY="+leader)
	killProcess(t, "nats-server", "POD_NAME=atoll-hub-0")
	t.Logf("%s after the cut of %s: killed atoll-cloud %s (the leader) and the hub server atoll-hub-0", time.Since(cut).Round(100*time.Millisecond), a1.Name, leader)
	inst.lostByKCM(t, a1.Name, cut)
	polls := inst.keptThroughCut(t, web["edge-a1"], client2, svc, "web-a-")
	if !inst.protected(a1.Name) {
		t.Errorf("atoll status does not show %s protected:\n%s", a1.Name, inst.atollStatus())
	}
	if got := taints(); len(got) > 0 {
		t.Errorf("%s got NoExecute taints while its peers saw it healthy: %v", a1.Name, got)
	}
	t.Logf("%d polls over %s of the cut: pod kept, endpoint ready, answering", polls, time.Since(cut).Round(time.Second))
	if lease, err := client.CoordinationV1().Leases("atoll-system").Get(ctx, "atoll-cloud", metav1.GetOptions{}); err == nil && lease.Spec.HolderIdentity != nil {
		t.Logf("leader now %s", *lease.Spec.HolderIdentity)
	}

	if err := a1.Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	for app, n := range map[string]int{"atoll-hub": 3, "atoll-cloud": 2, "atoll-edge": 3} {
		if err := bed.WaitPodsReady(ctx, app, n, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := bed.WaitSafe(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	t.Logf("healed: every pod Ready and atoll status SAFE %s later", time.Since(healed).Round(100*time.Millisecond))

	// A kubelet token for the probes, as an operator adds it, before its
	// grant.
	if _, err := bed.Kubectl(ctx, "-n", "atoll-system", "patch", "daemonset", "atoll-edge", "--type=json", "-p", `[
  {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "--kubelet-token-file=/var/run/secrets/kubelet/token"},
  {"op": "add", "path": "/spec/template/spec/containers/0/volumeMounts/-", "value": {"name": "kubelet-token", "mountPath": "/var/run/secrets/kubelet", "readOnly": true}},
  {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {"name": "kubelet-token", "projected": {"defaultMode": 256, "sources": [{"serviceAccountToken": {"expirationSeconds": 3600, "path": "token"}}]}}}
]`); err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Kubectl(ctx, "-n", "atoll-system", "rollout", "status", "daemonset/atoll-edge", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	inst.eventually(time.Minute, func() error {
		out, _ := bed.Atoll(ctx, "status")
		if !strings.HasPrefix(out, "DEGRADED") || !strings.Contains(out, "kubelet probe credentials of nodes edge-a1, edge-a2, edge-a3 refused") ||
			!strings.Contains(out, "fix --kubelet-token-file (get nodes/healthz)") {
			return fmt.Errorf("atoll status does not name the refused kubelet token:\n%s", out)
		}
		return nil
	})
	t.Logf("the kubelet token without its grant:\n%s", inst.atollStatus())
	for name := range bed.Edges {
		if inst.protected(name) {
			t.Errorf("%s protected while every node is Ready", name)
		}
	}
	if err := kubenode.GrantKubeletHealthz(ctx, client, "system:serviceaccount:atoll-system:atoll-edge"); err != nil {
		t.Fatal(err)
	}
	if err := bed.WaitSafe(ctx, time.Minute); err != nil {
		t.Fatalf("with the grant: %v", err)
	}

	// A new leaf CA at once (docs/operator-guide.md): atoll-cloud checks
	// its certificates every minute.
	if _, err := bed.Kubectl(ctx, "-n", "atoll-system", "patch", "secret", "atoll-hub-leaf-certs", "--type=json",
		"-p", `[{"op": "remove", "path": "/data"}]`); err != nil {
		t.Fatal(err)
	}
	replaced := time.Now()
	var fresh []byte
	inst.eventually(3*time.Minute, func() error {
		fresh = leafCABundle(ctx, t, inst)
		if string(fresh) == string(bundle) {
			return errors.New("the CA bundle is unchanged")
		}
		for _, p := range hubs.Items {
			if err := leafServes(p.Status.PodIP, fresh); err != nil {
				return fmt.Errorf("hub server %s: %w", p.Name, err)
			}
			if leafServes(p.Status.PodIP, bundle) == nil {
				return fmt.Errorf("hub server %s still serves a certificate of the old CA", p.Name)
			}
		}
		return nil
	})
	t.Logf("new leaf CA: every hub server serves its certificate %s after the Secret was emptied", time.Since(replaced).Round(100*time.Millisecond))
	killProcess(t, "nats-server", "POD_NAME=atoll-hub-1")
	if err := bed.WaitPodsReady(ctx, "atoll-hub", 3, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := bed.WaitSafe(ctx, 2*time.Minute); err != nil {
		t.Fatalf("after atoll-hub-1 was killed under the new CA: %v", err)
	}
}

// leafCABundle is the CA bundle atoll-cloud publishes for the edges.
func leafCABundle(ctx context.Context, t *testing.T, inst *installation) []byte {
	t.Helper()
	cm, err := inst.client.CoreV1().ConfigMaps("atoll-system").Get(ctx, hubtls.DefaultCABundle, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return []byte(cm.Data[hubtls.CAKey])
}

// leafServes checks that the leaf listener at ip requires TLS and serves a
// certificate bundle verifies under the name the edges check.
func leafServes(ip string, bundle []byte) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return errors.New("the CA bundle holds no certificate")
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "7422"), 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	info, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.Contains(info, `"tls_required":true`) {
		return fmt.Errorf("leaf listener does not require TLS: %s", info)
	}
	return tls.Client(c, &tls.Config{RootCAs: roots, ServerName: hubtls.DefaultHost, MinVersion: tls.VersionTLS12}).Handshake()
}

// hubRoutes are the names of the servers the hub server at ip routes to
// (its monitoring port's /routez).
func hubRoutes(ctx context.Context, t *testing.T, ip string) []string {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ip+":8222/routez", nil)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var rz struct {
		Routes []struct {
			Name string `json:"remote_name"`
		} `json:"routes"`
	}
	if err := json.Unmarshal(body, &rz); err != nil {
		t.Fatalf("routez of %s: %v: %s", ip, err, body)
	}
	names := map[string]bool{}
	for _, r := range rz.Routes {
		names[r.Name] = true
	}
	var out []string
	for n := range names {
		out = append(out, n)
	}
	return out
}

// killProcess kills with SIGKILL the one process named comm whose
// environment holds env among the containers of the test's fleet (found
// as any process of the nodes' kernel is).
func killProcess(t *testing.T, comm, env string) {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	var pids []int
	for _, c := range procs {
		if b, err := os.ReadFile(c); err != nil || strings.TrimSpace(string(b)) != comm {
			continue
		}
		dir := filepath.Dir(c)
		environ, _ := os.ReadFile(filepath.Join(dir, "environ"))
		for kv := range strings.SplitSeq(string(environ), "\x00") {
			if kv == env {
				var pid int
				if _, err := fmt.Sscanf(filepath.Base(dir), "%d", &pid); err == nil && kubenode.InFleet(pid, haNet) {
					pids = append(pids, pid)
				}
			}
		}
	}
	if len(pids) != 1 {
		t.Fatalf("%d processes %s with %s, want one: %v", len(pids), comm, env, pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}
