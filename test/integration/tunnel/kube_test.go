package tunnel_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
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
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// container is the stand-in's runtime: exec of "cat" copies stdin to
// stdout, any other command prints its arguments; attach prefixes each
// stdin line with "attached: "; port-forward to any port reaches echoAddr.
type container struct{ echoAddr string }

func (c container) ExecInContainer(_ context.Context, _, _, _ string, cmd []string, in io.Reader, out, _ io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 1 && cmd[0] == "cat" && in != nil {
		_, err := io.Copy(out, in)
		return err
	}
	_, err := fmt.Fprintln(out, strings.Join(cmd, " "))
	return err
}

func (c container) AttachContainer(_ context.Context, _, _, _ string, in io.Reader, out, _ io.WriteCloser, _ bool, _ <-chan remotecommand.TerminalSize) error {
	if in == nil {
		return fmt.Errorf("attach without stdin")
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		if _, err := fmt.Fprintf(out, "attached: %s\n", sc.Text()); err != nil {
			return err
		}
	}
	return sc.Err()
}

func (c container) PortForward(ctx context.Context, _, _ string, _ int32, stream io.ReadWriteCloser) error {
	conn, err := net.Dial("tcp", c.echoAddr)
	if err != nil {
		return err
	}
	defer conn.Close()
	go func() { _, _ = io.Copy(conn, stream); _ = conn.(*net.TCPConn).CloseWrite() }()
	_, err = io.Copy(stream, conn)
	return err
}

// kubeletStandIn serves, over TLS like a kubelet, containerLogs (plain,
// and with follow=true a line every 100 ms until the client goes), and
// exec, attach and portForward with the upstream streaming packages
// (k8s.io/cri-streaming). The log of pods bench and bench-new is
// benchLog, a few hundred bytes (bench-new's with Connection: close, so
// that the apiserver opens a connection for each request); any other's is
// one hello line.
func kubeletStandIn(t testing.TB) string {
	t.Helper()
	rt := container{echoAddr: echoServer(t)}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/"), "/")
		switch {
		case len(parts) == 4 && parts[0] == "exec":
			opts, err := remotecommand.NewOptions(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			remotecommand.ServeExec(w, r, rt, parts[2], "", parts[3], r.URL.Query()["command"], opts, time.Minute, 30*time.Second, remotecommand.SupportedStreamingProtocols)
			return
		case len(parts) == 4 && parts[0] == "attach":
			opts, err := remotecommand.NewOptions(r)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			remotecommand.ServeAttach(w, r, rt, parts[2], "", parts[3], opts, time.Minute, 30*time.Second, remotecommand.SupportedStreamingProtocols)
			return
		case len(parts) == 3 && parts[0] == "portForward":
			portforward.ServePortForward(w, r, rt, parts[2], "", nil, time.Minute, 30*time.Second, portforward.SupportedProtocols)
			return
		case len(parts) == 4 && parts[0] == "containerLogs":
		default:
			http.NotFound(w, r)
			return
		}
		if parts[2] == "bench" || parts[2] == "bench-new" {
			if parts[2] == "bench-new" { // the apiserver dials anew for each request
				w.Header().Set("Connection", "close")
			}
			_, _ = io.WriteString(w, benchLog)
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

// kubeCluster is the real apiserver with its egress selector pointed at
// the first tunnel replica, a node n1 whose InternalIP (10.255.255.1)
// does not route (only the tunnel reaches its kubelet stand-in) and the
// running pods of addNodeAndPod on it.
type kubeCluster struct {
	kc      *kubetest.Cluster
	rig     *rig
	bin     string
	kubelet string // the kubelet stand-in's address
}

// startKubeCluster starts the rig (first tunes the first replica) and
// then the apiserver with egress(the first replica's CONNECT address).
func startKubeCluster(t testing.TB, first func(*tunnel.Config), egress func(addr string) kubetest.Option) *kubeCluster {
	t.Helper()
	kubectlPath, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	kubelet := kubeletStandIn(t)
	res := &lazyNodes{}
	r := setupWith(t, kubelet, res, first)
	addr := r.servers[0].Addrs()[0]
	connect := addr.String()
	if addr.Network() == "unix" {
		connect = "unix:" + connect
	}
	kc := kubetest.Start(t, egress(connect))
	_, port, _ := net.SplitHostPort(kubelet)
	res.n.Store(&tunnel.Nodes{Lister: addNodeAndPod(t, kc, "10.255.255.1", port)})
	return &kubeCluster{kc: kc, rig: r, bin: kubectlPath, kubelet: kubelet}
}

// addNodeAndPod creates in kc the node n1 with InternalIP addr and its
// kubelet on port, and the running pods default/web, bench and bench-new
// (container app) on it; it returns a synced Node lister.
func addNodeAndPod(t testing.TB, kc *kubetest.Cluster, addr, port string) listersv1.NodeLister {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs := kc.Client()
	f := informers.NewSharedInformerFactory(cs, 0)
	lister := f.Core().V1().Nodes().Lister()
	stop := make(chan struct{})
	f.Start(stop)
	t.Cleanup(func() { close(stop); f.Shutdown() }) // Shutdown waits for stop
	node, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("kubelet port %q: %v", port, err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.WaitForCacheSync(ctx.Done())
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "bench", "bench-new"} {
		pod, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "app", Image: "example"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning // kubectl port-forward and attach want a running pod
		if _, err := cs.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return lister
}

func (k *kubeCluster) kubectl(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kc.KubeconfigPath()}, args...)...)
}

// logs checks kubectl logs.
func (k *kubeCluster) logs(t *testing.T, ctx context.Context) {
	t.Helper()
	out, err := k.kubectl(ctx, "logs", "web", "-c", "app").CombinedOutput()
	if err != nil || string(out) != "hello from default/web/app on the edge\n" {
		t.Fatalf("kubectl logs: %v\n%s\n%s", err, out, k.kc.LogTails(20))
	}
}

// TestKubectlThroughTunnel: the real kube-apiserver, its egress
// selector pointed at the tunnel's CONNECT socket (UDS), reaches a kubelet
// stand-in whose node address (10.255.255.1) does not route: only the
// tunnel reaches it. kubectl logs and logs -f work; the CONNECT host is the
// node's InternalIP, resolved through the Node cache. Then exec -i with
// stdin, attach -i with stdin and port-forward (SPDY upgrades end to end).
func TestKubectlThroughTunnel(t *testing.T) {
	dir, err := os.MkdirTemp("", "tun")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "connect.sock")
	k := startKubeCluster(t, func(c *tunnel.Config) { c.ConnectAddr = "unix:" + sock }, kubetest.WithClusterEgress)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kubectl := k.kubectl
	k.logs(t, ctx)

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

	// exec -i: stdin goes to the container and back.
	execCmd := kubectl(ctx, "exec", "-i", "web", "-c", "app", "--", "cat")
	execCmd.Stdin = strings.NewReader("stdin through the tunnel\n")
	out, err := execCmd.CombinedOutput()
	if err != nil || string(out) != "stdin through the tunnel\n" {
		t.Fatalf("kubectl exec -i: %v\n%s", err, out)
	}

	// attach -i: stdin reaches the running container's attached streams.
	attach := kubectl(ctx, "attach", "-i", "-q", "web", "-c", "app")
	attach.Stdin = strings.NewReader("one\ntwo\n")
	var attachErr strings.Builder
	attach.Stderr = &attachErr
	out, err = attach.Output()
	if err != nil || string(out) != "attached: one\nattached: two\n" {
		t.Fatalf("kubectl attach -i: %v\n%q\n%s", err, out, attachErr.String())
	}

	// port-forward: a local port reaches the pod's port through the tunnel.
	local, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	pf := kubectl(pctx, "port-forward", "pod/web", fmt.Sprintf("%d:8080", local))
	pfOut, _ := pf.StdoutPipe()
	var pfErr strings.Builder
	pf.Stderr = &pfErr
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { pcancel(); _ = pf.Wait() }()
	if sc := bufio.NewScanner(pfOut); !sc.Scan() || !strings.Contains(sc.Text(), "Forwarding from") {
		_ = pf.Wait()
		t.Fatalf("kubectl port-forward: %q %s", sc.Text(), pfErr.String())
	}
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", local))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, 1<<20, nil)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TestKubectlLogsCutShort: kubectl logs -f through the tunnel, and the
// node's leaf link then silently drops every packet. Once the session is
// lost (the rig's link timeout, 8 s) the replica resets kube-apiserver's
// connection to the kubelet, logs the loss and counts the session as
// failed, and kubectl's stream ends (it does not hang).
//
// kubectl itself exits 0: kube-apiserver (k8s.io/apiserver v0.36.3,
// responsewriters.StreamObject) copies the kubelet's log stream to the
// client with io.Copy and drops its error, so a stream cut short ends
// for the client as a complete one, whatever the connection under it
// did. The stream is TLS from kube-apiserver to the kubelet, so the tunnel
// cannot mark it in band either. The test holds that: were kube-apiserver
// to report the error one day, it fails, and the docs change with it.
func TestKubectlLogsCutShort(t *testing.T) {
	dir, err := os.MkdirTemp("", "tun")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := startKubeCluster(t, func(c *tunnel.Config) { c.ConnectAddr = "unix:" + filepath.Join(dir, "connect.sock") }, kubetest.WithClusterEgress)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	k.logs(t, ctx)
	failed := counterVec(t, k.rig.serverRegs[0], "atoll_tunnel_server_sessions_ended_total", "result", "error")
	cmd := k.kubectl(ctx, "logs", "-f", "web")
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for _, w := range []string{"hello from default/web/app on the edge", "line 1", "line 2"} {
		if !sc.Scan() || sc.Text() != w {
			t.Fatalf("kubectl logs -f: got %q (%v), want %q", sc.Text(), sc.Err(), w)
		}
	}
	cut := time.Now()
	k.rig.proxy.Stall()
	defer k.rig.proxy.Restore()
	for sc.Scan() {
	}
	err = cmd.Wait()
	t.Logf("kubectl logs -f ended %v after the cut: %v %s", time.Since(cut).Round(time.Millisecond), err, strings.TrimSpace(stderr.String()))
	if err != nil {
		t.Fatalf("kubectl logs -f through a lost session failed (%v: %s): kube-apiserver now reports a cut stream; say so in docs/tunnel.md", err, stderr.String())
	}
	if got := counterVec(t, k.rig.serverRegs[0], "atoll_tunnel_server_sessions_ended_total", "result", "error"); got != failed+1 {
		t.Fatalf("sessions ended with an error: %v, want %v", got, failed+1)
	}
}
