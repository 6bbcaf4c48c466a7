package kubenode_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
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

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestRealNode runs one real node (kubelet, containerd, runc, CNI) on a
// real control plane and checks what a cluster of real nodes promises:
// the Node registers Ready; a pod pulled from the fleet's registry runs,
// gets an address from the node's pod network and answers HTTP from the
// host; the kubelet refuses an unauthenticated request (401) and one of
// a user without the right (403), and serves /healthz to a user granted
// only get nodes/healthz; the node's state disk fills up and frees
// while the pod serves; NodeRestriction keeps the node's credentials to
// its own Node; after a power cut (kubelet, containerd and the
// containers SIGKILLed) and a boot on the same disk, the pod runs and
// answers again.
func TestRealNode(t *testing.T) {
	// Kubernetes' default tolerations (300 s): a node cut off below is
	// not Atoll-protected here, and the test's 10 s would evict its pod
	// while it reboots offline.
	cluster, fleet, node := kubenode.StartWithNode(t, kubenode.Config{Net: 1, LocalAPI: true, KeepPodIPs: true, StateDiskSize: "64m"}, "edge-1",
		kubetest.WithTolerationSeconds(300, 300))
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	client := cluster.Client()

	first := startHello(ctx, t, cluster, fleet, node)
	t.Logf("pod hello Ready at %s", first.Status.PodIP)

	t.Run("service through kube-proxy", func(t *testing.T) { helloService(ctx, t, cluster.Client(), node) })

	t.Run("silent cut", func(t *testing.T) {
		if err := node.Cut(kubenode.HostIP(1)); err != nil {
			t.Fatal(err)
		}
		if _, err := hello(ctx, first.Status.PodIP); err == nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a cut node's pod: %v, want a timeout", err)
		}
		if err := node.Heal(); err != nil {
			t.Fatal(err)
		}
		if _, err := hello(ctx, first.Status.PodIP); err != nil {
			t.Errorf("after the heal: %v", err)
		}
	})

	t.Run("degraded link", func(t *testing.T) {
		// Every packet of the uplink lost: the pod does not answer from
		// outside, but does inside the node (the kubelet's probes); a
		// 1 Mbit/s rate with no loss: it does. Restore ends both.
		if err := node.Degrade(100, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := hello(ctx, first.Status.PodIP); err == nil {
			t.Error("the pod of a node losing every packet answered")
		}
		if out, err := node.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+net.JoinHostPort(first.Status.PodIP, "8080")+"/"); err != nil {
			t.Errorf("from inside the node, with its uplink losing every packet: %v %s", err, out)
		}
		if err := node.Degrade(0, "1mbit"); err != nil {
			t.Fatal(err)
		}
		if out, err := node.Exec(ctx, "tc", "qdisc", "show", "dev", "eth0"); err != nil || !strings.Contains(out, "tbf") {
			t.Errorf("the rate limit is not set: %v %s", err, out)
		}
		if _, err := hello(ctx, first.Status.PodIP); err != nil {
			t.Errorf("rate limited: %v", err)
		}
		node.Restore()
		if out, _ := node.Exec(ctx, "tc", "qdisc", "show", "dev", "eth0"); strings.Contains(out, "tbf") {
			t.Errorf("the rate limit outlived Restore: %s", out)
		}
	})

	t.Run("state disk full", func(t *testing.T) {
		// Nothing can be written to /var/lib/atoll (the local API
		// endpoint's cache is there) while the pod keeps serving; freed,
		// it can again.
		took, err := node.FillDisk()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("filled with %d MiB", took>>20)
		probe := filepath.Join(node.HostPath("/var/lib/atoll"), "probe")
		if err := os.WriteFile(probe, []byte("x"), 0o600); !errors.Is(err, syscall.ENOSPC) {
			t.Errorf("write to the full state disk: %v, want ENOSPC", err)
		}
		if _, err := hello(ctx, first.Status.PodIP); err != nil {
			t.Errorf("with the state disk full: %v", err)
		}
		if err := node.FreeDisk(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(probe, []byte("x"), 0o600); err != nil {
			t.Errorf("write to the freed state disk: %v", err)
		}
		_ = os.Remove(probe)
	})

	t.Run("kubelet authentication", func(t *testing.T) {
		url := "https://" + net.JoinHostPort(node.IP, "10250")
		if code, _ := kubeletGet(t, cluster, url+"/healthz", nil); code != http.StatusUnauthorized {
			t.Errorf("unauthenticated GET /healthz: %d, want 401", code)
		}
		nobody := clientCert(t, cluster, "nobody")
		if code, _ := kubeletGet(t, cluster, url+"/healthz", nobody); code != http.StatusForbidden {
			t.Errorf("GET /healthz as a user without rights: %d, want 403", code)
		}
		if err := kubenode.GrantKubeletHealthz(ctx, client, "atoll-probe"); err != nil {
			t.Fatal(err)
		}
		prober := clientCert(t, cluster, "atoll-probe")
		poll.Eventually(t, 30*time.Second, func() error { // the kubelet caches refusals briefly
			if code, body := kubeletGet(t, cluster, url+"/healthz", prober); code != http.StatusOK || body != "ok" {
				return fmt.Errorf("GET /healthz with get nodes/healthz: %d %q", code, body)
			}
			return nil
		})
		if code, _ := kubeletGet(t, cluster, url+"/pods", prober); code != http.StatusForbidden {
			t.Errorf("GET /pods with only get nodes/healthz: %d, want 403", code)
		}
	})

	t.Run("node restriction", func(t *testing.T) {
		other := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}
		if _, err := client.CoreV1().Nodes().Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cert, key, err := cluster.IssueClientCert("system:node:"+node.Name, "system:nodes")
		if err != nil {
			t.Fatal(err)
		}
		rc := cluster.RESTConfig()
		rc.CertFile, rc.KeyFile, rc.CertData, rc.KeyData = "", "", cert, key
		asNode := kubernetes.NewForConfigOrDie(rc)
		patch := []byte(`{"metadata":{"labels":{"taken":"yes"}}}`)
		if _, err := asNode.CoreV1().Nodes().Patch(ctx, "other", types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("the node's credentials patched another Node: %v", err)
		}
		if _, err := asNode.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Errorf("the node's credentials cannot patch its own Node: %v", err)
		}
	})

	t.Run("power cut and boot", func(t *testing.T) {
		node.PowerCut()
		if _, err := hello(ctx, first.Status.PodIP); err == nil {
			t.Fatal("the pod still answers after the power cut")
		}
		begin := time.Now()
		if err := node.Boot(ctx); err != nil {
			t.Fatal(err)
		}
		again := waitServing(ctx, t, client, node, first.Status.ContainerStatuses[0].RestartCount+1)
		t.Logf("after the boot: pod Ready again at %s in %s, restarts %d", again.Status.PodIP,
			time.Since(begin).Round(10*time.Millisecond), again.Status.ContainerStatuses[0].RestartCount)
		if again.Status.PodIP != first.Status.PodIP {
			t.Errorf("the pod came back at %s, want its address %s (atoll-ipam)", again.Status.PodIP, first.Status.PodIP)
		}
		first = again
	})

	// The node reboots while its link to the control plane is down: the
	// kubelet gets its pod, the pod's ConfigMap, Secret and token from the
	// local API endpoint's cache and starts it; once the link is back its
	// status reaches the apiserver.
	t.Run("power cut and boot offline", func(t *testing.T) { first = bootOffline(ctx, t, cluster, node, first) })

	// The same while the link comes and goes: the local API endpoint
	// turns online and offline under the booting kubelet.
	t.Run("power cut and boot while the link flaps", func(t *testing.T) { bootFlapping(ctx, t, cluster, node, first) })
}

// bootFlapping power-cuts node and boots it while its link to the control
// plane flaps (cut for 6 s, longer than the local API endpoint's probe
// timeout, then up for 4 s, two of its probe intervals, over and over
// until 20 s after the pod serves again): pod hello serves again at its
// address, and once the link holds the apiserver has the pod Ready there,
// restarted once more.
func bootFlapping(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, node *kubenode.Node, first *corev1.Pod) {
	t.Helper()
	node.PowerCut()
	stop, stopped := make(chan struct{}), make(chan struct{})
	flaps := 0
	go func() {
		defer close(stopped)
		for {
			var err error
			if flaps%2 == 0 {
				err = node.Cut(node.HostIP())
			} else {
				err = node.Heal()
			}
			if err != nil {
				t.Errorf("flap: %v", err)
				return
			}
			flaps++
			wait := 4 * time.Second // up
			if flaps%2 == 1 {
				wait = 6 * time.Second // cut
			}
			select {
			case <-stop:
				return
			case <-time.After(wait):
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-stopped
	}()
	at := bootServing(ctx, t, node)
	if at != first.Status.PodIP {
		t.Errorf("the pod came back at %s, want its address %s", at, first.Status.PodIP)
	}
	time.Sleep(20 * time.Second) // flapping on under the running pod
	close(stop)
	<-stopped
	if err := node.Heal(); err != nil {
		t.Fatal(err)
	}
	t.Logf("link flapped %d times; pod serving at %s", flaps, at)
	again := waitServing(ctx, t, cluster.Client(), node, first.Status.ContainerStatuses[0].RestartCount+1)
	if again.Status.PodIP != first.Status.PodIP {
		t.Errorf("the apiserver has the pod at %s, want %s", again.Status.PodIP, first.Status.PodIP)
	}
	metrics, err := node.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+kubenode.LocalAPIAdminAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	// Not asserted: whether the endpoint saw the flaps (it may stay
	// offline from the boot until the link holds).
	t.Logf("local API endpoint under the flapping link:\n%s", grepLines(metrics, "atoll_localapi_transitions_total"))
}

// bootOffline cuts node from the control plane (and the hub: everything
// at the fleet's host address), power-cuts it and boots it: pod hello
// (first, as the apiserver had it) serves again at its address, started
// from the local API's cache; once the link is back its status reaches
// the apiserver.
func bootOffline(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, node *kubenode.Node, first *corev1.Pod) *corev1.Pod {
	t.Helper()
	client := cluster.Client()
	if err := node.Cut(node.HostIP()); err != nil {
		t.Fatal(err)
	}
	node.PowerCut()
	begin := time.Now()
	at := bootServing(ctx, t, node)
	t.Logf("offline boot: pod serving at %s in %s", at, time.Since(begin).Round(10*time.Millisecond))
	if at != first.Status.PodIP {
		t.Errorf("the pod came back at %s, want its address %s: the EndpointSlices the unit serves name it", at, first.Status.PodIP)
	}
	metrics, err := node.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+kubenode.LocalAPIAdminAddr+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`atoll_localapi_requests_total{answer="cache",component="kubelet",verb="token"}`,
		`atoll_localapi_requests_total{answer="cache",component="kubelet",verb="watch"}`,
		`atoll_localapi_apiserver_reachable 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("the local API's metrics lack %s", want)
		}
	}
	if err := node.Heal(); err != nil {
		t.Fatal(err)
	}
	again := waitServing(ctx, t, client, node, first.Status.ContainerStatuses[0].RestartCount+1)
	if again.Status.PodIP != at {
		t.Errorf("the apiserver has the pod at %s, the node serves it at %s", again.Status.PodIP, at)
	}
	return again
}

// helloService puts Service hello in front of pod hello and waits until
// the node reaches the pod at its ClusterIP, through kube-proxy.
func helloService(ctx context.Context, t *testing.T, client kubernetes.Interface, node *kubenode.Node) {
	t.Helper()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "hello"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
	svc, err := client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, time.Minute, func() error {
		out, err := node.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+svc.Spec.ClusterIP+"/")
		if err != nil {
			return err
		}
		if !strings.HasPrefix(out, "hello from hello") {
			return fmt.Errorf("ClusterIP %s answered %q", svc.Spec.ClusterIP, out)
		}
		return nil
	})
}

// startHello runs pod hello on node, with what a pod that starts offline
// needs from the local API: a ConfigMap, a Secret and the projected
// service-account token every pod gets; it returns the pod once it is
// Ready and answers.
func startHello(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, fleet *kubenode.Fleet, node *kubenode.Node) *corev1.Pod {
	t.Helper()
	client := cluster.Client()
	if err := cluster.WaitForServiceAccount(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		Data: map[string]string{"greeting": "hello"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hello"},
		StringData: map[string]string{"password": "hello"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default", Labels: map[string]string{"app": "hello"}},
		Spec: corev1.PodSpec{
			NodeName: node.Name,
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
					LocalObjectReference: corev1.LocalObjectReference{Name: "hello"}}}},
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "hello"}}},
			},
			Containers: []corev1.Container{{
				Name: "hello", Image: fleet.Image("hello"),
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/config"}, {Name: "secret", MountPath: "/secret"}},
				Ports:        []corev1.ContainerPort{{ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
					HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}}},
			}},
		},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return waitServing(ctx, t, client, node)
}

// bootServing boots node and returns the address its pod hello answers
// at, from inside the node, once it does.
func bootServing(ctx context.Context, t *testing.T, node *kubenode.Node) string {
	t.Helper()
	if err := node.Boot(ctx); err != nil {
		t.Fatal(err)
	}
	var at string
	poll.Eventually(t, 2*time.Minute, func() error {
		var err error
		at, err = servingOnNode(ctx, node)
		return err
	})
	return at
}

// servingOnNode finds, from inside the node, the address its pod hello
// answers at: one of the node's pod network allocations.
func servingOnNode(ctx context.Context, node *kubenode.Node) (string, error) {
	ips, err := os.ReadDir(filepath.Join(node.Disk, "cni", "ipam", "kubenode"))
	if err != nil {
		return "", err
	}
	for _, f := range ips {
		if net.ParseIP(f.Name()) == nil {
			continue
		}
		out, err := node.Exec(ctx, "curl", "-sS", "--max-time", "1", "http://"+net.JoinHostPort(f.Name(), "8080")+"/")
		if err == nil && strings.HasPrefix(out, "hello from hello") {
			return f.Name(), nil
		}
	}
	return "", errors.New("pod hello answers at none of the node's pod addresses")
}

// waitServing waits until pod hello is Ready (with at least minRestarts
// restarts) and answers HTTP from the host at its address.
func waitServing(ctx context.Context, t *testing.T, client kubernetes.Interface, node *kubenode.Node, minRestarts ...int32) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := poll.Until(ctx, func(ctx context.Context) error {
		p, err := client.CoreV1().Pods("default").Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return err
		}
		ready := false
		for _, c := range p.Status.Conditions {
			ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
		}
		if !ready || len(p.Status.ContainerStatuses) == 0 {
			return fmt.Errorf("pod hello not Ready: %s %v", p.Status.Phase, p.Status.ContainerStatuses)
		}
		if len(minRestarts) > 0 && p.Status.ContainerStatuses[0].RestartCount < minRestarts[0] {
			return fmt.Errorf("pod hello Ready from before the power cut (restarts %d)", p.Status.ContainerStatuses[0].RestartCount)
		}
		body, err := hello(ctx, p.Status.PodIP)
		if err != nil {
			return err
		}
		if !strings.HasPrefix(body, "hello from hello") {
			return fmt.Errorf("pod hello answered %q", body)
		}
		pod = p
		return nil
	}); err != nil {
		t.Fatalf("%v\n%s", err, node.LogTails(20))
	}
	return pod
}

func hello(ctx context.Context, ip string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(ip, "8080")+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// clientCert is a client certificate of user, signed by the cluster CA.
func clientCert(t *testing.T, cluster *kubetest.Cluster, user string) *tls.Certificate {
	t.Helper()
	certPEM, keyPEM, err := cluster.IssueClientCert(user)
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return &c
}

// kubeletGet GETs url from the kubelet (its serving certificate checked
// against the cluster CA) with cert, or without a client certificate.
func kubeletGet(t *testing.T, cluster *kubetest.Cluster, url string, cert *tls.Certificate) (int, string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(cluster.CABundle())
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := c.Get(url) //nolint:noctx // bounded by the client's timeout
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// grepLines returns the lines of s that contain substr.
func grepLines(s, substr string) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
