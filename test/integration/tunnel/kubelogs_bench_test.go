package tunnel_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// benchLog is pod bench's log: a few hundred bytes, what a small
// `kubectl logs` returns.
var benchLog = strings.Repeat("2026-11-26T12:00:00Z INFO request served path=/healthz status=200\n", 5)

// BenchmarkKubectlLogs measures small `kubectl logs` requests through the
// real kube-apiserver two ways: an apiserver whose egress selector sends
// kubelet connections through the tunnel (its CONNECT socket, the hub,
// node n1's edge server and agent, as in TestKubectlThroughTunnel), and a
// second apiserver (its own etcd) without egress selector that dials the
// same kubelet stand-in directly (node n1's InternalIP is 127.0.0.1 there).
// Both run at once and the requests alternate between them, so that the
// load of a shared machine falls on both alike.
//
// (a) ATOLL_BENCH_LOGS_N (default 200) requests each way through
// client-go's GetLogs().DoRaw, the request kubectl makes, twice: with the
// apiserver's kubelet connection kept alive (pod bench; through the
// tunnel no session opens per request) and with a new one per request
// (pod bench-new, whose log the kubelet answers with Connection: close:
// one session each, and the kubelet's TLS handshake); (b)
// ATOLL_BENCH_KUBECTL_N (default 20) runs each way of the kubectl binary,
// whose process start dominates. It prints p50/p90/p99 of each and the
// overhead tunnel − direct of each quantile, and the tunnel sessions the
// apiserver opened per request. Run with -benchtime 1x:
//
//	go test -run '^$' -bench KubectlLogs -benchtime 1x ./cloud/tunnel/
func BenchmarkKubectlLogs(b *testing.B) {
	n := envInt(b, "ATOLL_BENCH_LOGS_N", 200)
	runs := envInt(b, "ATOLL_BENCH_KUBECTL_N", 20)
	dir, err := os.MkdirTemp("", "tun")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "connect.sock")
	tun := startKubeCluster(b, func(c *tunnel.Config) { c.ConnectAddr = "unix:" + sock }, kubetest.WithClusterEgress)
	direct := &kubeCluster{kc: kubetest.Start(b), bin: tun.bin}
	_, port, err := net.SplitHostPort(tun.kubelet)
	if err != nil {
		b.Fatal(err)
	}
	addNodeAndPod(b, direct.kc, "127.0.0.1", port)

	ways := []*kubeCluster{direct, tun}
	names := []string{"direct", "tunnel"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	for b.Loop() {
		var sb strings.Builder
		fmt.Fprintf(&sb, "\nkubectl logs of a %d-byte log through the real kube-apiserver, direct vs tunnel (requests alternate)\n", len(benchLog))
		fmt.Fprintf(&sb, "%-28s %10s %10s %10s\n", "", "p50", "p90", "p99")
		table := func(what, unit string, lat [][]time.Duration) {
			fmt.Fprintln(&sb, what)
			q := make([][3]time.Duration, len(lat))
			for i, l := range lat {
				q[i] = quantiles(l)
				fmt.Fprintf(&sb, "%-28s %10s %10s %10s\n", fmt.Sprintf("  %s (%d)", names[i], len(l)), ms(q[i][0]), ms(q[i][1]), ms(q[i][2]))
			}
			fmt.Fprintf(&sb, "%-28s %10s %10s %10s\n", "  overhead tunnel − direct", ms(q[1][0]-q[0][0]), ms(q[1][1]-q[0][1]), ms(q[1][2]-q[0][2]))
			b.ReportMetric(float64(q[1][0]-q[0][0])/1e3, unit+"-overhead-p50-µs")
			b.ReportMetric(float64(q[1][2]-q[0][2])/1e3, unit+"-overhead-p99-µs")
		}

		// client-go, the apiserver's kubelet connection kept alive (pod
		// bench) and a new one for each request (pod bench-new: the
		// kubelet answers Connection: close, so through the tunnel each
		// request opens a session).
		for _, mode := range []struct{ pod, what, unit string }{
			{"bench", "client-go GetLogs, the apiserver's kubelet connection kept alive", "getlogs"},
			{"bench-new", "client-go GetLogs, a new kubelet connection per request", "getlogs-new"},
		} {
			for i, k := range ways { // warm up: TLS to the apiserver, its kubelet transport
				for range 5 {
					if _, err := getLogs(ctx, k.kc.Client(), mode.pod); err != nil {
						b.Fatalf("%s: %v", names[i], err)
					}
				}
			}
			opens0 := counterSum(b, tun.rig, "atoll_tunnel_server_session_opens_total")
			lat := make([][]time.Duration, len(ways))
			for j := range n {
				for i := range ways {
					i = (i + j) % len(ways) // alternate which goes first
					d, err := getLogs(ctx, ways[i].kc.Client(), mode.pod)
					if err != nil {
						b.Fatalf("%s request %d: %v", names[i], j, err)
					}
					lat[i] = append(lat[i], d)
				}
			}
			opens := counterSum(b, tun.rig, "atoll_tunnel_server_session_opens_total") - opens0
			table(fmt.Sprintf("%s (tunnel sessions opened per request: %.2f)", mode.what, opens/float64(n)), mode.unit, lat)
		}

		// kubectl logs: the binary, runs times each way, alternating.
		klat := make([][]time.Duration, len(ways))
		for j := range runs {
			for i := range ways {
				i = (i + j) % len(ways)
				start := time.Now()
				out, err := ways[i].kubectl(ctx, "logs", "bench").CombinedOutput()
				d := time.Since(start)
				if err != nil || string(out) != benchLog {
					b.Fatalf("%s kubectl logs: %v\n%s", names[i], err, out)
				}
				klat[i] = append(klat[i], d)
			}
		}
		table("kubectl logs (the binary, its process start included)", "kubectl", klat)
		fmt.Print(sb.String())
	}
}

// getLogs is the request kubectl logs makes; it checks the log.
func getLogs(ctx context.Context, cs kubernetes.Interface, pod string) (time.Duration, error) {
	start := time.Now()
	body, err := cs.CoreV1().Pods("default").GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(ctx)
	d := time.Since(start)
	if err != nil {
		return d, fmt.Errorf("logs: %w: %s", err, body)
	}
	if string(body) != benchLog {
		return d, fmt.Errorf("logs: got %q, want %q", body, benchLog)
	}
	return d, nil
}

// quantiles returns p50, p90 and p99 of l.
func quantiles(l []time.Duration) [3]time.Duration {
	s := slices.Sorted(slices.Values(l))
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return [3]time.Duration{at(0.50), at(0.90), at(0.99)}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

func envInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// counterSum is the sum of the counter name over its labels in the first
// replica's registry.
func counterSum(b *testing.B, r *rig, name string) float64 {
	mfs, err := r.serverRegs[0].Gather()
	if err != nil {
		b.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
