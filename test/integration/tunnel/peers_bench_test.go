package tunnel_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/test/freeport"
	"github.com/atoll-edge/atoll/test/gobuild"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// BenchmarkTunnelPeers measures the tunnel as deployed beside
// konnectivity (apiserver-network-proxy, pinned in tools/peers/konnectivity)
// and direct loopback TCP, in the same run: each tunnel's two programs in
// processes of their own, on loopback.
//
//   - Atoll: the atoll-cloud binary with the embedded-hub overlay's flags
//     (the hub embedded, leaf TLS with the certificates it generates, the
//     CONNECT listener with mutual TLS as deploy/components/tunnel-mtls
//     sets it) against a kubetest control plane, and the atoll-edge
//     binary with the DaemonSet's flags (endpoints proxy and tunnel on),
//     enrolled by itself with a pod-bound ServiceAccount token, its leaf
//     link verifying the hub with the published CA bundle.
//   - konnectivity: proxy-server in http-connect mode, its front over TCP
//     with mutual TLS (as kube-apiserver's egress selector dials it), its
//     agent port over TLS; proxy-agent dialling it with the CA.
//
// A client in this process CONNECTs through each (mutual TLS) to targets
// in this process. Per path: one bulk stream of ATOLL_BENCH_TUNNEL_MIB
// (default 512) MiB of random bytes each way (up: cloud → edge), the CPU
// the tunnel's two processes used for it (from /proc), round trips of
// 100 bytes on an open connection (p50, p99), and sessions opened per
// second by one client (CONNECT, one byte each way, close) for 5 s;
// then the peak resident memory of each tunnel process.
// With ATOLL_BENCH_TUNNEL_PROFILE=DIR it then takes CPU profiles of
// both tunnels' processes during bulk streams each way, into DIR.
//
//	go tool task bench:tunnel:peers
//
// It needs kube:build and konnectivity:build.
func BenchmarkTunnelPeers(b *testing.B) {
	size := benchBytes(b, "ATOLL_BENCH_TUNNEL_MIB", 512)
	data := randomBytes(4<<20, 3)
	bulk, echo := bulkServer(b, data), echoServer(b)
	cluster := kubetest.Start(b)
	atoll := startAtollTunnel(b, cluster, bulk, echo)
	konn := startKonnectivity(b, cluster, echo)
	paths := []tunnelPath{directPath{}, konn, atoll}

	for range b.N {
		for _, p := range paths {
			for _, dir := range []string{"up", "down"} {
				b.Run(p.name()+"/"+dir, func(b *testing.B) {
					cpu0 := p.cpu(b)
					start := time.Now()
					bulkOnce(b, p.dial(b, bulk), dir, size, data)
					took := time.Since(start)
					b.ReportMetric(float64(size)/took.Seconds()/1e6, "MB/s")
					if cpu := p.cpu(b) - cpu0; p.name() != "direct" {
						b.ReportMetric(cpu.Seconds()/(float64(size)/(1<<30)), "cpu-s/GiB")
					}
				})
			}
		}
		for _, p := range paths {
			b.Run(p.name()+"/rtt", func(b *testing.B) {
				c := p.dial(b, echo)
				defer c.Close()
				msg, buf := make([]byte, 100), make([]byte, 100)
				lat := make([]time.Duration, 0, 5000)
				for range cap(lat) {
					t0 := time.Now()
					if _, err := c.Write(msg); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, buf); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			})
		}
		for _, p := range paths {
			b.Run(p.name()+"/sessions", func(b *testing.B) {
				one := []byte{1}
				n, start := 0, time.Now()
				for time.Since(start) < 5*time.Second {
					c := p.dial(b, echo)
					if _, err := c.Write(one); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, one); err != nil {
						b.Fatal(err)
					}
					c.Close()
					n++
				}
				b.ReportMetric(float64(n)/time.Since(start).Seconds(), "sessions/s")
			})
		}
	}
	for _, p := range []*connectPath{konn, atoll} {
		b.Run(p.label+"/memory", func(b *testing.B) {
			for i, cmd := range p.procs {
				b.ReportMetric(float64(peakRSS(b, cmd.Process.Pid))/(1<<20), fmt.Sprintf("%s-max-rss-MiB", p.names[i]))
			}
		})
	}
	if dir := os.Getenv("ATOLL_BENCH_TUNNEL_PROFILE"); dir != "" {
		for _, p := range []*connectPath{konn, atoll} {
			for _, d := range []string{"up", "down"} {
				p.profile(b, filepath.Join(dir, p.label+"-"+d), func() { bulkOnce(b, p.dial(b, bulk), d, 64<<20, data) })
			}
		}
	}
}

// profile runs load over and over while it takes a 10 s CPU profile of
// each of the path's processes, into files prefix-0.pprof, prefix-1.pprof.
func (p *connectPath) profile(b *testing.B, prefix string, load func()) {
	done := make(chan error, len(p.pprof))
	for i, base := range p.pprof {
		go func() {
			resp, err := http.Get(base + "/profile?seconds=10")
			if err != nil {
				done <- err
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				done <- fmt.Errorf("%s: %s", base, resp.Status)
				return
			}
			out, err := os.Create(fmt.Sprintf("%s-%d.pprof", prefix, i))
			if err == nil {
				_, err = io.Copy(out, resp.Body)
				out.Close()
			}
			done <- err
		}()
	}
	for n := 0; n < len(p.pprof); {
		select {
		case err := <-done:
			if err != nil {
				b.Fatal(err)
			}
			n++
		default:
			load()
		}
	}
	b.Logf("profiles of %s in %s-*.pprof", p.label, prefix)
}

// tunnelPath is one way to reach a target of this process.
type tunnelPath interface {
	name() string
	// dial connects to target (a loopback host:port of this process).
	dial(b *testing.B, target string) net.Conn
	// cpu is the CPU time the path's programs used so far.
	cpu(b *testing.B) time.Duration
}

type directPath struct{}

func (directPath) name() string { return "direct" }

func (directPath) dial(b *testing.B, target string) net.Conn {
	c, err := net.Dial("tcp", target)
	if err != nil {
		b.Fatal(err)
	}
	return c
}

func (directPath) cpu(*testing.B) time.Duration { return 0 }

// connectPath CONNECTs through an HTTP CONNECT listener over mutual TLS.
type connectPath struct {
	label string
	addr  string
	tls   *tls.Config
	// host is the CONNECT host of a target port.
	host  func(port string) string
	procs []*exec.Cmd
	names []string // of procs
	// pprof are the processes' /debug/pprof base URLs.
	pprof []string
}

func (p *connectPath) name() string { return p.label }

func (p *connectPath) dial(b *testing.B, target string) net.Conn {
	_, port, _ := net.SplitHostPort(target)
	c, err := tls.Dial("tcp", p.addr, p.tls)
	if err != nil {
		b.Fatalf("%s: %v", p.label, err)
	}
	host := p.host(port)
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		c.Close()
		b.Fatalf("%s: CONNECT %s: %v %v", p.label, host, resp, err)
	}
	return &readerConn{Conn: c, r: br}
}

func (p *connectPath) cpu(*testing.B) time.Duration {
	var total time.Duration
	for _, cmd := range p.procs {
		total += kubetest.ProcessCPU(cmd.Process.Pid)
	}
	return total
}

// peakRSS is the most resident memory process pid had (VmHWM), in bytes.
func peakRSS(b *testing.B, pid int) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}

// benchCerts writes, from the cluster's CA, a serving certificate for
// 127.0.0.1 and a client certificate into dir, and returns the client's
// TLS configuration.
func benchCerts(b *testing.B, c *kubetest.Cluster, dir string) *tls.Config {
	srvCert, srvKey, err := c.IssueServingCert("127.0.0.1", "localhost")
	if err != nil {
		b.Fatal(err)
	}
	cliCert, cliKey, err := c.IssueClientCert("bench-client")
	if err != nil {
		b.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.crt": c.CABundle(), "server.crt": srvCert, "server.key": srvKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	pair, err := tls.X509KeyPair(cliCert, cliKey)
	if err != nil {
		b.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.CABundle())
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

func freePorts(b *testing.B, n int) []int {
	ports := make([]int, n)
	for i := range ports {
		p, err := freeport.Port()
		if err != nil {
			b.Fatal(err)
		}
		ports[i] = p
	}
	return ports
}

// startKonnectivity runs proxy-server (http-connect mode, mutual TLS on
// its front and TLS on its agent port) and one proxy-agent, and waits
// until a CONNECT reaches the echo target.
func startKonnectivity(b *testing.B, c *kubetest.Cluster, echo string) *connectPath {
	bin := filepath.Join(c.BinDir(), "konnectivity")
	for _, prog := range []string{"proxy-server", "proxy-agent"} {
		if _, err := os.Stat(filepath.Join(bin, prog)); err != nil {
			b.Skipf("no %s: run go tool task konnectivity:build (%v)", prog, err)
		}
	}
	dir := b.TempDir()
	clientTLS := benchCerts(b, c, dir)
	p := freePorts(b, 6)
	ca, crt, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key")
	server := gobuild.Start(b, filepath.Join(dir, "proxy-server.log"), filepath.Join(bin, "proxy-server"),
		"--mode=http-connect", "--uds-name=",
		"--server-bind-address=127.0.0.1", "--server-port="+strconv.Itoa(p[0]),
		"--server-cert="+crt, "--server-key="+key, "--server-ca-cert="+ca,
		"--agent-bind-address=127.0.0.1", "--agent-port="+strconv.Itoa(p[1]),
		"--cluster-cert="+crt, "--cluster-key="+key,
		"--admin-port="+strconv.Itoa(p[2]), "--health-bind-address=127.0.0.1", "--health-port="+strconv.Itoa(p[3]),
		"--enable-profiling")
	agent := gobuild.Start(b, filepath.Join(dir, "proxy-agent.log"), filepath.Join(bin, "proxy-agent"),
		"--proxy-server-host=127.0.0.1", "--proxy-server-port="+strconv.Itoa(p[1]), "--ca-cert="+ca,
		"--agent-identifiers=ipv4=127.0.0.1",
		"--admin-server-port="+strconv.Itoa(p[4]), "--health-server-port="+strconv.Itoa(p[5]),
		"--enable-profiling")
	k := &connectPath{label: "konnectivity", addr: fmt.Sprintf("127.0.0.1:%d", p[0]), tls: clientTLS,
		host: func(port string) string { return "127.0.0.1:" + port }, procs: []*exec.Cmd{server, agent}, names: []string{"server", "agent"},
		pprof: []string{fmt.Sprintf("http://127.0.0.1:%d/debug/pprof", p[2]), fmt.Sprintf("http://127.0.0.1:%d/debug/pprof", p[4])}}
	waitConnect(b, k, echo)
	return k
}

// waitConnect waits until a CONNECT through p reaches the echo target.
func waitConnect(b *testing.B, p *connectPath, echo string) {
	_, port, _ := net.SplitHostPort(echo)
	poll.Eventually(b, 2*time.Minute, func() error {
		c, err := tls.Dial("tcp", p.addr, p.tls)
		if err != nil {
			return err
		}
		defer c.Close()
		host := p.host(port)
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: CONNECT %s: %s", p.label, host, resp.Status)
		}
		if _, err := c.Write([]byte{7}); err != nil {
			return err
		}
		var one [1]byte
		_, err = io.ReadFull(br, one[:])
		return err
	})
}

// startAtollTunnel runs atoll-cloud and atoll-edge as deployed (see
// BenchmarkTunnelPeers) for node n1, its tunnel allowed to the targets'
// ports, and waits until a CONNECT reaches the last target (an echo).
func startAtollTunnel(b *testing.B, c *kubetest.Cluster, targets ...string) *connectPath {
	ctx := b.Context()
	client := c.Client()
	dir := b.TempDir()
	clientTLS := benchCerts(b, c, dir)
	const ns = "atoll-system"
	create := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	create(err)
	_, err = client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "atoll-edge"}}, metav1.CreateOptions{})
	create(err)
	// The Secrets the manifests create empty for atoll-cloud to fill.
	for _, name := range []string{"atoll-cloud-webhook-certs", identity.DefaultEnrollSecret, hubtls.DefaultSecret} {
		_, err := client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		create(err)
	}

	cloudBin, err := gobuild.Binary(ctx, "services/atoll-cloud")
	if err != nil {
		b.Fatal(err)
	}
	edgeBin, err := gobuild.Binary(ctx, "services/atoll-edge")
	if err != nil {
		b.Fatal(err)
	}
	p := freePorts(b, 8)
	cloudAdmin := fmt.Sprintf("127.0.0.1:%d", p[0])
	cloud := gobuild.Start(b, filepath.Join(dir, "atoll-cloud.log"), cloudBin,
		"--kubeconfig="+c.KubeconfigPath(),
		"--admin-addr="+cloudAdmin,
		"--webhook-addr="+fmt.Sprintf("127.0.0.1:%d", p[1]),
		"--hub-host=127.0.0.1",
		"--hub-client-port="+strconv.Itoa(p[2]),
		"--hub-leaf-port="+strconv.Itoa(p[3]),
		"--hub-store-dir="+filepath.Join(dir, "hub"),
		"--identity-dir="+filepath.Join(dir, "identity"),
		"--hub-leaf-certs=generate",
		"--leader-election-namespace="+ns,
		"--kube-qps=100", "--kube-burst=200", "--protect-qps=200", "--protect-burst=400",
		"--annotate-qps=20", "--annotate-burst=40", "--grid-qps=500", "--grid-burst=1000",
		"--tunnel-connect-addr="+fmt.Sprintf("127.0.0.1:%d", p[4]),
		"--tunnel-connect-tls-cert="+filepath.Join(dir, "server.crt"),
		"--tunnel-connect-tls-key="+filepath.Join(dir, "server.key"),
		"--tunnel-connect-client-ca="+filepath.Join(dir, "ca.crt"),
		"--log-format=json")
	waitReady(b, cloudAdmin, "atoll-cloud")

	// Node n1 and the agent's pod on it, whose bound token enrolls it.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	node, err = client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	create(err)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}}
	_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	create(err)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "atoll-edge-n1", Namespace: ns}, Spec: corev1.PodSpec{
		NodeName: "n1", ServiceAccountName: "atoll-edge", Containers: []corev1.Container{{Name: "atoll-edge", Image: "atoll-edge"}}}}
	pod, err = client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	create(err)
	tr, err := client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "atoll-edge", &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{
		Audiences:      []string{identity.DefaultEnrollAudience},
		BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	create(err)
	enroll, hubCA := filled(b, client, ns)
	for name, data := range map[string][]byte{"token": []byte(tr.Status.Token), "enroll.creds": enroll, "hub-ca.crt": hubCA} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	var allow []string
	for _, t := range targets {
		_, port, _ := net.SplitHostPort(t)
		allow = append(allow, "127.0.0.1:"+port)
	}
	edgeAdmin := fmt.Sprintf("127.0.0.1:%d", p[5])
	edge := gobuild.Start(b, filepath.Join(dir, "atoll-edge.log"), edgeBin,
		"--node-name=n1",
		"--hub-url="+fmt.Sprintf("nats-leaf://127.0.0.1:%d", p[3]),
		"--internal-ip=127.0.0.1",
		"--creds-file="+filepath.Join(dir, "node.creds"),
		"--enroll-creds-file="+filepath.Join(dir, "enroll.creds"),
		"--service-account-token-file="+filepath.Join(dir, "token"),
		"--bootstrap-token-file="+filepath.Join(dir, "bootstrap.creds"),
		"--state-dir="+filepath.Join(dir, "state"),
		"--proxy-addr=127.0.0.1:0",
		"--hosts-file="+filepath.Join(dir, "atoll.hosts"),
		"--admin-addr="+edgeAdmin,
		"--hub-ca-file="+filepath.Join(dir, "hub-ca.crt"),
		"--hub-tls-server-name=atoll-hub.atoll-system.svc",
		"--client-port="+strconv.Itoa(p[6]),
		"--route-host=127.0.0.1", "--route-port="+strconv.Itoa(p[7]),
		"--tunnel-allow="+strings.Join(allow, ","),
		"--log-format=json")
	waitReady(b, edgeAdmin, "atoll-edge")
	a := &connectPath{label: "atoll", addr: fmt.Sprintf("127.0.0.1:%d", p[4]), tls: clientTLS,
		host: func(port string) string { return "n1:" + port }, procs: []*exec.Cmd{cloud, edge}, names: []string{"cloud", "edge"},
		pprof: []string{"http://" + cloudAdmin + "/debug/pprof", "http://" + edgeAdmin + "/debug/pprof"}}
	waitConnect(b, a, targets[len(targets)-1])
	return a
}

// filled waits until atoll-cloud has filled the enrollment Secret and
// published the hub's CA bundle, and returns both.
func filled(b *testing.B, client kubernetes.Interface, ns string) (enroll, hubCA []byte) {
	poll.Eventually(b, time.Minute, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := client.CoreV1().Secrets(ns).Get(ctx, identity.DefaultEnrollSecret, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cm, err := client.CoreV1().ConfigMaps(ns).Get(ctx, hubtls.DefaultCABundle, metav1.GetOptions{})
		if err != nil {
			return err
		}
		enroll, hubCA = s.Data[identity.EnrollCredsKey], []byte(cm.Data[hubtls.CAKey])
		if len(enroll) == 0 || len(hubCA) == 0 {
			return fmt.Errorf("enrollment credentials (%d bytes) or hub CA bundle (%d bytes) not written yet", len(enroll), len(hubCA))
		}
		return nil
	})
	return enroll, hubCA
}

// waitReady waits until the admin endpoint addr answers /readyz with 200.
func waitReady(b *testing.B, addr, name string) {
	poll.Eventually(b, 2*time.Minute, func() error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s /readyz: %s", name, resp.Status)
		}
		return nil
	})
}
