package kubenode_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// BenchmarkNodeBoot measures a real node's start (go tool task
// bench:nodes): cold, from an empty disk to the Node Ready and to a pod
// pulled from the registry Ready (cold-node-s, cold-pod-s); then each
// iteration cuts the power and boots the node on the same disk, to the
// pod Ready again with one more restart (boot-pod-s, the mean). The Node
// itself stays Ready through a short power cut (the node lifecycle
// controller's grace is 5 s), so its Ready says nothing of a boot.
func BenchmarkNodeBoot(b *testing.B) {
	if err := kubenode.Prerequisites(); err != nil {
		b.Skip(err)
	}
	cluster := kubetest.Start(b, kubenode.ClusterOptions(4)...)
	fleet := kubenode.StartForTest(b, cluster, kubenode.Config{Net: 4})
	ctx, cancel := context.WithTimeout(b.Context(), 10*time.Minute)
	defer cancel()
	client := cluster.Client()
	if err := cluster.WaitForServiceAccount(ctx, "default"); err != nil {
		b.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "edge-1", Containers: []corev1.Container{{Name: "hello", Image: fleet.Image("hello")}}}}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	node, err := fleet.Add(ctx, "edge-1")
	if err != nil {
		b.Fatal(err)
	}
	coldNode := time.Since(start)
	podReady(ctx, b, client, 0)
	coldPod := time.Since(start)

	var podTotal time.Duration
	restarts := int32(0)
	for b.Loop() {
		node.PowerCut()
		restarts++
		begin := time.Now()
		if err := node.Boot(ctx); err != nil {
			b.Fatal(err)
		}
		podReady(ctx, b, client, restarts)
		podTotal += time.Since(begin)
	}
	// Reported after the loop: b.Loop's first call deletes the metrics
	// reported before it.
	b.ReportMetric(coldNode.Seconds(), "cold-node-s")
	b.ReportMetric(coldPod.Seconds(), "cold-pod-s")
	b.ReportMetric(podTotal.Seconds()/float64(b.N), "boot-pod-s")
}

// podReady waits until pod hello is Ready with at least restarts
// restarts.
func podReady(ctx context.Context, b *testing.B, client kubernetes.Interface, restarts int32) {
	b.Helper()
	if err := poll.Until(ctx, func(ctx context.Context) error {
		p, err := client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue &&
				len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].RestartCount >= restarts {
				return nil
			}
		}
		return fmt.Errorf("pod hello not Ready (restarts %d)", restarts)
	}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOfflineReboot measures a node rebooting with and without its
// link to the control plane (go tool task bench:autonomy): a real node
// whose kubelet reaches the apiserver only through the local API endpoint
// and whose pods get their addresses from atoll-ipam, running 30 pods
// (each with a ConfigMap, a Secret and the projected token) and
// atoll-edge as a host service linked to a hub, with its endpoints proxy
// and hosts file (a unit of one). Each
// iteration cuts the power and boots the node online, to every pod
// answering at its address from the node (online-boot-s), then the same
// with the node cut from the control plane (offline-boot-s), then heals
// and waits until the apiserver has every pod Ready at its address again
// (heal-ready-s). After the loop: the resident memory of the local API
// endpoint and of the agent (local-api-rss-MiB, agent-rss-MiB), the
// memory both hold together (atoll-pss-MiB: their proportional set
// sizes added, since the two processes of one binary share its pages,
// which each one's resident size counts in full) and the records the
// endpoint wrote in 5 quiet minutes online, a minute after the heal
// (quiet-writes/5min; the harness's kubelet reports its Node every 10
// s).
func BenchmarkOfflineReboot(b *testing.B) {
	if err := kubenode.Prerequisites(); err != nil {
		b.Skip(err)
	}
	const pods = 30 // the kubelet's maxPods here
	// The agent's hub, which the node reaches on the bridge.
	h := natstest.Hub(b, func(c *hub.Config) { c.Host = "0.0.0.0" })
	leafURL := "nats-leaf://" + net.JoinHostPort(kubenode.HostIP(4), h.LeafURL().Port())
	// Kubernetes' default tolerations: the test default (10 s) would
	// evict the pods of the node cut off (nothing protects it here).
	cluster := kubetest.Start(b, append(kubenode.ClusterOptions(4), kubetest.WithTolerationSeconds(300, 300))...)
	fleet := kubenode.StartForTest(b, cluster, kubenode.Config{Net: 4, LocalAPI: true, KeepPodIPs: true,
		HostAgent: hubAgent(b, h, leafURL, "--proxy-addr=127.0.0.1:9471", "--hosts-file=/var/lib/atoll/dns/atoll.hosts")})
	ctx, cancel := context.WithTimeout(b.Context(), 20*time.Minute)
	defer cancel()
	client := cluster.Client()
	if err := cluster.WaitForServiceAccount(ctx, "default"); err != nil {
		b.Fatal(err)
	}
	node, err := fleet.Add(ctx, "edge-1")
	if err != nil {
		b.Fatal(err)
	}
	for i := range pods {
		name := fmt.Sprintf("hello-%02d", i)
		if err := errors.Join(
			create(ctx, client.CoreV1().ConfigMaps("default").Create, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{"k": name}}),
			create(ctx, client.CoreV1().Secrets("default").Create, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"k": name}}),
			create(ctx, client.CoreV1().Pods("default").Create, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "hello"}},
				Spec: corev1.PodSpec{NodeName: node.Name,
					Volumes: []corev1.Volume{
						{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}},
						{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}},
					Containers: []corev1.Container{{Name: "hello", Image: fleet.Image("hello"),
						VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/config"}, {Name: "secret", MountPath: "/secret"}},
						ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
							HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}}}}}}),
		); err != nil {
			b.Fatal(err)
		}
	}
	addrs := allReady(ctx, b, client, pods)
	serving := func() {
		b.Helper()
		if err := poll.Until(ctx, func(ctx context.Context) error {
			for name, ip := range addrs {
				out, err := node.Exec(ctx, "curl", "-sS", "--max-time", "1", "http://"+net.JoinHostPort(ip, "8080")+"/")
				if err != nil || !strings.HasPrefix(out, "hello from "+name) {
					return fmt.Errorf("pod %s at %s: %v %q", name, ip, err, out)
				}
			}
			return nil
		}); err != nil {
			b.Fatalf("%v\n%s", err, node.LogTails(20))
		}
	}
	var online, offline, heal time.Duration
	for b.Loop() {
		node.PowerCut()
		begin := time.Now()
		if err := node.Boot(ctx); err != nil {
			b.Fatal(err)
		}
		serving()
		online += time.Since(begin)
		allReady(ctx, b, client, pods)

		if err := node.Cut(kubenode.HostIP(4)); err != nil {
			b.Fatal(err)
		}
		node.PowerCut()
		begin = time.Now()
		if err := node.Boot(ctx); err != nil {
			b.Fatal(err)
		}
		serving()
		offline += time.Since(begin)
		if err := node.Heal(); err != nil {
			b.Fatal(err)
		}
		begin = time.Now()
		if got := allReady(ctx, b, client, pods); !maps.Equal(got, addrs) {
			b.Fatalf("pods at %v after the offline reboot, were at %v", got, addrs)
		}
		heal += time.Since(begin)
	}
	// The kubelet reports each pod's status once more in the first
	// seconds after the heal: the quiet window starts a minute later.
	time.Sleep(time.Minute)
	before := nodeMetrics(ctx, b, node, kubenode.LocalAPIAdminAddr, "atoll_localapi_cache_writes_total")
	time.Sleep(5 * time.Minute) // the quiet window measured
	after := nodeMetrics(ctx, b, node, kubenode.LocalAPIAdminAddr, "atoll_localapi_cache_writes_total")
	quiet := 0.0
	for series, v := range after {
		if d := v - before[series]; d > 0 {
			quiet += d
			b.Logf("quiet 5 minutes: %v writes of %s", d, series)
		}
	}
	rss := nodeMetrics(ctx, b, node, kubenode.LocalAPIAdminAddr, "process_resident_memory_bytes")[""]
	agentRSS := nodeMetrics(ctx, b, node, "127.0.0.1:9470", "process_resident_memory_bytes")[""]
	pss := atollPSS(b, filepath.Join(filepath.Dir(node.Disk), "bin", "atoll-edge"))
	b.ReportMetric(online.Seconds()/float64(b.N), "online-boot-s")
	b.ReportMetric(offline.Seconds()/float64(b.N), "offline-boot-s")
	b.ReportMetric(heal.Seconds()/float64(b.N), "heal-ready-s")
	b.ReportMetric(rss/(1<<20), "local-api-rss-MiB")
	b.ReportMetric(agentRSS/(1<<20), "agent-rss-MiB")
	b.ReportMetric(pss/(1<<20), "atoll-pss-MiB")
	b.ReportMetric(quiet, "quiet-writes/5min")
}

func create[T any](ctx context.Context, f func(context.Context, T, metav1.CreateOptions) (T, error), obj T) error {
	_, err := f(ctx, obj, metav1.CreateOptions{})
	return err
}

// allReady waits until n pods app=hello are Ready and returns their
// addresses by name.
func allReady(ctx context.Context, b *testing.B, client kubernetes.Interface, n int) map[string]string {
	b.Helper()
	var addrs map[string]string
	if err := poll.Until(ctx, func(ctx context.Context) error {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=hello"})
		if err != nil {
			return err
		}
		addrs = map[string]string{}
		for _, p := range pods.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					addrs[p.Name] = p.Status.PodIP
				}
			}
		}
		if len(addrs) < n {
			return fmt.Errorf("%d of %d pods Ready", len(addrs), n)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	return addrs
}

// nodeMetrics reads metric name of the program of the node whose admin
// endpoint is at addr (the local API endpoint's, the agent's): each
// series by its labels ("" for an unlabelled metric).
func nodeMetrics(ctx context.Context, b *testing.B, node *kubenode.Node, addr, name string) map[string]float64 {
	b.Helper()
	out, err := node.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+addr+"/metrics")
	if err != nil {
		b.Fatal(err)
	}
	series := map[string]float64{}
	for line := range strings.SplitSeq(out, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || rest == "" || rest[0] != ' ' && rest[0] != '{' {
			continue
		}
		labels, v := "", rest
		if rest[0] == '{' {
			end := strings.Index(rest, "}")
			labels, v = rest[:end+1], rest[end+1:]
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			b.Fatal(err)
		}
		series[labels] = f
	}
	if len(series) == 0 {
		b.Fatalf("%s exports no %s", addr, name)
	}
	return series
}

// atollPSS adds up the proportional set sizes (/proc/PID/smaps_rollup) of
// the processes running exe, in bytes.
func atollPSS(b *testing.B, exe string) float64 {
	b.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	total, n := 0.0, 0
	for _, p := range procs {
		if target, err := os.Readlink(p); err != nil || target != exe {
			continue
		}
		rollup, err := os.ReadFile(filepath.Join(filepath.Dir(p), "smaps_rollup"))
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.SplitSeq(string(rollup), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "Pss:" {
				kb, err := strconv.ParseFloat(f[1], 64)
				if err != nil {
					b.Fatal(err)
				}
				total += kb * 1024
				n++
			}
		}
	}
	if n != 2 {
		b.Fatalf("%d processes of %s, want the agent and the local API endpoint", n, exe)
	}
	return total
}
