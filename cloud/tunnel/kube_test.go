package tunnel_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/internal/testenv/kubetest"
)

// kubeletStandIn serves containerLogs over TLS like a kubelet: plain, and
// with follow=true a line every 100 ms until the client goes.
func kubeletStandIn(t *testing.T) string {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if len(parts) != 4 || parts[0] != "containerLogs" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "hello from %s/%s/%s on the edge\n", parts[1], parts[2], parts[3])
		if r.URL.Query().Get("follow") != "true" {
			return
		}
		for i := 1; ; i++ {
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			fmt.Fprintf(w, "line %d\n", i)
		}
	}))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// lazyNodes resolves through a Node lister set once the cluster is up
// (the apiserver needs the tunnel's socket to start).
type lazyNodes struct{ n atomic.Pointer[tunnel.Nodes] }

func (l *lazyNodes) NodeFor(host string) (string, bool) {
	if n := l.n.Load(); n != nil {
		return n.NodeFor(host)
	}
	return "", false
}

// TestKubectlLogsThroughTunnel: the real kube-apiserver, its egress
// selector pointed at the tunnel's CONNECT socket, reaches a kubelet
// stand-in whose node address (10.255.255.1) does not route: only the
// tunnel reaches it. kubectl logs and logs -f work; the CONNECT host is the
// node's InternalIP, resolved through the Node cache.
func TestKubectlLogsThroughTunnel(t *testing.T) {
	if _, err := os.Stat("/usr/bin/kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	kubelet := kubeletStandIn(t)
	_, port, _ := net.SplitHostPort(kubelet)
	dir, err := os.MkdirTemp("", "tun")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "connect.sock")
	res := &lazyNodes{}
	setupWith(t, kubelet, "unix:"+sock, res)
	kc := kubetest.Start(t, kubetest.WithClusterEgress("unix:"+sock))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	cs := kc.Client()
	f := informers.NewSharedInformerFactory(cs, 0)
	lister := f.Core().V1().Nodes().Lister()
	f.Start(ctx.Done())
	defer f.Shutdown()
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.255.255.1"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitForCacheSync(ctx.Done())
	res.n.Store(&tunnel.Nodes{Lister: lister})
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "example"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, "/usr/bin/kubectl", append([]string{"--kubeconfig", kc.KubeconfigPath()}, args...)...)
	}

	out, err := kubectl(ctx, "logs", "web", "-c", "app").CombinedOutput()
	if err != nil || string(out) != "hello from default/web/app on the edge\n" {
		t.Fatalf("kubectl logs: %v\n%s\n%s", err, out, kc.LogTails(20))
	}

	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	cmd := kubectl(fctx, "logs", "-f", "web")
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	want := []string{"hello from default/web/app on the edge", "line 1", "line 2", "line 3"}
	for _, w := range want {
		if !sc.Scan() || sc.Text() != w {
			t.Fatalf("kubectl logs -f: got %q (%v), want %q", sc.Text(), sc.Err(), w)
		}
	}
	fcancel()
	_ = cmd.Wait()
}
