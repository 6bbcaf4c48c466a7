package localapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/internal/logging"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

const kubeletUA = "kubelet/v1.36.3 (linux/amd64) kubernetes/test"

// localAPI runs a local API endpoint for the node whose credentials are
// in pki, keeping its cache in dir, until the returned stop is called
// (or the test ends).
func localAPI(t testing.TB, apiserver, caFile, pki, dir string) (*Server, func()) {
	t.Helper()
	cfg := Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.APIServer, cfg.CAFile, cfg.Dir = apiserver, caFile, dir
	cfg.CertFile, cfg.KeyFile = filepath.Join(pki, "node.crt"), filepath.Join(pki, "node.key")
	cfg.Timeout, cfg.ProbeInterval, cfg.FlushInterval = time.Second, 200*time.Millisecond, 100*time.Millisecond
	log, err := logging.New(logging.Config{Level: "debug", Format: "text"}, t.Output())
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, prometheus.NewRegistry(), log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("local API stopped: %v", err)
		}
	}
	t.Cleanup(stop)
	return s, stop
}

// clientOf is a client of the local API endpoint as component ua.
func clientOf(t testing.TB, s *Server, ua string) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + s.Addr(), UserAgent: ua, QPS: -1,
		ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}, Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeCredentials writes a client certificate of system:node:<name>.
func nodeCredentials(t testing.TB, cluster *kubetest.Cluster, name string) string {
	t.Helper()
	dir := t.TempDir()
	cert, key, err := cluster.IssueClientCert("system:node:"+name, "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{"node.crt": cert, "node.key": key} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// blackhole is kube-apiserver's address on a dead link: connections are
// accepted and never answered.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	return "https://" + l.Addr().String()
}

func boundPod(name, node string, volumes ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "app", Volumes: volumes,
			Containers: []corev1.Container{{Name: "c", Image: "example/app"}}}}
}

func secretVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}
}

// podInformer is the kubelet's view of its pods: a list and watch of the
// pods bound to node.
func podInformer(t *testing.T, c kubernetes.Interface, node string) (cache.SharedIndexInformer, func()) {
	t.Helper()
	f := informers.NewSharedInformerFactoryWithOptions(c, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}))
	inf := f.Core().V1().Pods().Informer()
	stop := make(chan struct{})
	f.Start(stop)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(stop)
		t.Fatal("the pod informer did not sync through the local API")
	}
	return inf, func() { close(stop); f.Shutdown() }
}

func podNames(inf cache.SharedIndexInformer) []string {
	var names []string
	for _, o := range inf.GetStore().List() {
		names = append(names, o.(*corev1.Pod).Name)
	}
	return names
}

// TestNodeReadsOutliveTheLink runs the node's components against a real
// kube-apiserver through the local API endpoint, then starts the
// endpoint again on the same disk with kube-apiserver unreachable (a
// reboot with the link down): what the node read is answered, as it
// was; what it did not read, writes, and another component's reads are
// refused with 503; a damaged record is dropped and named.
func TestNodeReadsOutliveTheLink(t *testing.T) {
	cluster := kubetest.Start(t)
	admin := cluster.Client()
	ctx := t.Context()
	if err := cluster.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}))
	must(admin.CoreV1().ServiceAccounts("app").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}))
	for _, s := range []string{"mine", "theirs", "rotated"} {
		must(admin.CoreV1().Secrets("app").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s},
			StringData: map[string]string{"k": s}}, metav1.CreateOptions{}))
	}
	p1, err := admin.CoreV1().Pods("app").Create(ctx, boundPod("p1", "n1", secretVolume("mine"), secretVolume("rotated")), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	must(admin.CoreV1().Pods("app").Create(ctx, boundPod("p2", "n2", secretVolume("theirs")), metav1.CreateOptions{}))

	pki, dir := nodeCredentials(t, cluster, "n1"), t.TempDir()
	s, stop := localAPI(t, cluster.APIServerURL(), cluster.CAFile(), pki, dir)
	kubelet := clientOf(t, s, kubeletUA)
	poll.Eventually(t, 10*time.Second, func() error {
		_, err := kubelet.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err
	})
	inf, stopInformer := podInformer(t, kubelet, "n1")
	// A pod bound while the watch runs reaches the kept list.
	must(admin.CoreV1().Pods("app").Create(ctx, boundPod("p3", "n1"), metav1.CreateOptions{}))
	poll.Eventually(t, 10*time.Second, func() error {
		if got := podNames(inf); len(got) != 2 {
			return errors.New("the informer holds " + strings.Join(got, ","))
		}
		return nil
	})
	lastRV := inf.LastSyncResourceVersion()
	stopInformer()
	for _, name := range []string{"mine", "rotated"} {
		must(kubelet.CoreV1().Secrets("app").Get(ctx, name, metav1.GetOptions{}))
	}
	// A reflector's list when it cannot stream one: resourceVersion=0,
	// limit=500, answered whole.
	mineList := metav1.ListOptions{FieldSelector: "metadata.name=mine", ResourceVersion: "0", Limit: 500}
	must(kubelet.CoreV1().Secrets("app").List(ctx, mineList))
	if _, err := kubelet.CoreV1().Secrets("app").Get(ctx, "theirs", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("another node's Secret through the local API: %v, want Forbidden (the Node authorizer decides)", err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		ExpirationSeconds: new(int64(3600)),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "p1", UID: p1.UID}}}
	issued, err := kubelet.CoreV1().ServiceAccounts("app").CreateToken(ctx, "app", tr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stop()

	// A record cut short (a power cut on a file system that lost it).
	damaged := s.cache.file(recID("kubelet", "/api/v1/namespaces/app/secrets/rotated"))
	b, err := os.ReadFile(damaged)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(damaged, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}

	off, _ := localAPI(t, blackhole(t), cluster.CAFile(), pki, dir)
	if got := testutil.ToFloat64(off.m.corrupt); got != 1 {
		t.Errorf("damaged records counted: %v, want 1", got)
	}
	kubelet = clientOf(t, off, kubeletUA)
	pods, err := kubelet.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 || pods.ResourceVersion != lastRV {
		t.Errorf("offline list: %d pods at %s, want 2 at %s (the kept list, as the watch left it)", len(pods.Items), pods.ResourceVersion, lastRV)
	}
	inf, stopInformer = podInformer(t, kubelet, "n1")
	defer stopInformer()
	if got := podNames(inf); len(got) != 2 {
		t.Errorf("offline informer: %v, want p1 and p3", got)
	}
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("offline get of the node: %v", err)
	}
	if sec, err := kubelet.CoreV1().Secrets("app").Get(ctx, "mine", metav1.GetOptions{}); err != nil || string(sec.Data["k"]) != "mine" {
		t.Errorf("offline get of a Secret the node read: %v", err)
	}
	if l, err := kubelet.CoreV1().Secrets("app").List(ctx, mineList); err != nil || len(l.Items) != 1 || l.Continue != "" {
		t.Errorf("offline paged list of a Secret the node listed: %v", err)
	}
	for _, name := range []string{"theirs", "rotated"} {
		_, err := kubelet.CoreV1().Secrets("app").Get(ctx, name, metav1.GetOptions{})
		if !apierrors.IsServiceUnavailable(err) || !strings.Contains(err.Error(), "holds no answer") {
			t.Errorf("offline get of Secret %s (never read, or damaged): %v, want 503 naming the cache", name, err)
		}
	}
	again, err := kubelet.CoreV1().ServiceAccounts("app").CreateToken(ctx, "app", tr, metav1.CreateOptions{})
	if err != nil || again.Status.Token != issued.Status.Token {
		t.Errorf("offline token request: %v; the same token: %v", err, err == nil && again.Status.Token == issued.Status.Token)
	}
	pod := pods.Items[0].DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	if _, err := kubelet.CoreV1().Pods("app").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); !apierrors.IsServiceUnavailable(err) ||
		!strings.Contains(err.Error(), "retry once kube-apiserver is reachable") {
		t.Errorf("offline write: %v, want 503 saying it was not sent", err)
	}
	kubeProxy := clientOf(t, off, "kube-proxy/v1.36.3")
	if _, err := kubeProxy.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); !apierrors.IsServiceUnavailable(err) {
		t.Errorf("another component's offline list of the kubelet's pods: %v, want 503", err)
	}
}

// TestSlowAPIServerAndBack makes kube-apiserver slow under a running
// local API endpoint, two ways: paused (SIGSTOP: it answers nothing) and
// answering every byte 3 s late (a delaying proxy in front of it, the
// endpoint's timeout 1 s). A kept read is answered from the cache once
// the apiserver is slower than the timeout, a write is refused as not
// sent, watches are held; when it answers in time again the held watches
// end and the components watch kube-apiserver again, seeing what changed.
func TestSlowAPIServerAndBack(t *testing.T) {
	for _, tt := range []struct {
		name string
		slow func(t *testing.T, cluster *kubetest.Cluster, link *delayLink) (resume func() error)
	}{
		{"paused", func(t *testing.T, cluster *kubetest.Cluster, _ *delayLink) func() error {
			resume, err := cluster.PauseAPIServer()
			if err != nil {
				t.Fatal(err)
			}
			return resume
		}},
		{"answering late", func(_ *testing.T, _ *kubetest.Cluster, link *delayLink) func() error {
			link.delay.Store(int64(3 * time.Second))
			return func() error { link.delay.Store(0); return nil }
		}},
		// Every byte lost, connections left open (a cut the ends do not
		// see): the pooled connections are dead for good, and the probes
		// after the cut dial anew.
		{"dropping every byte", func(_ *testing.T, _ *kubetest.Cluster, link *delayLink) func() error {
			link.drop.Store(true)
			return func() error { link.drop.Store(false); return nil }
		}},
	} {
		t.Run(tt.name, func(t *testing.T) { slowAPIServerAndBack(t, tt.slow) })
	}
}

func slowAPIServerAndBack(t *testing.T, slow func(*testing.T, *kubetest.Cluster, *delayLink) func() error) {
	cluster := kubetest.Start(t)
	admin := cluster.Client()
	ctx := t.Context()
	if err := cluster.CreateNamespace(ctx, "app"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts("app").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Pods("app").Create(ctx, boundPod("p1", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	link := newDelayLink(t, strings.TrimPrefix(cluster.APIServerURL(), "https://"))
	s, _ := localAPI(t, "https://"+link.addr, cluster.CAFile(), nodeCredentials(t, cluster, "n1"), t.TempDir())
	kubelet := clientOf(t, s, kubeletUA)
	poll.Eventually(t, 10*time.Second, func() error {
		_, err := kubelet.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err
	})
	inf, stopInformer := podInformer(t, kubelet, "n1")
	defer stopInformer()

	resume := slow(t, cluster, link)
	resumed := false
	defer func() {
		if !resumed {
			_ = resume()
		}
	}()
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Errorf("a kept read while kube-apiserver is slow: %v, want the cache's answer", err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if testutil.ToFloat64(s.m.heldWatches) < 1 {
			return errors.New("the pod watch is not held by the cache yet")
		}
		if testutil.ToFloat64(s.m.online) != 0 {
			return errors.New("kube-apiserver still counts as reachable")
		}
		return nil
	})
	_, err := kubelet.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("a write while kube-apiserver is slow: %v, want 503 (not sent)", err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	back := time.Now()
	poll.Eventually(t, 30*time.Second, func() error {
		if testutil.ToFloat64(s.m.online) != 1 {
			return errors.New("kube-apiserver does not count as reachable again")
		}
		return nil
	})
	t.Logf("online again %v after the link was", time.Since(back).Round(time.Millisecond))
	if _, err := admin.CoreV1().Pods("app").Create(ctx, boundPod("p2", "n1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if got := podNames(inf); len(got) != 2 {
			return errors.New("the informer holds " + strings.Join(got, ","))
		}
		return nil
	})
	if got := testutil.ToFloat64(s.m.transitions.WithLabelValues("online")); got != 2 {
		t.Errorf("back online %v times, want 2 (start, resume)", got)
	}
}

// delayLink is a TCP proxy to kube-apiserver that holds every chunk it
// passes for delay: a slow link that still answers.
type delayLink struct {
	addr  string
	delay atomic.Int64 // nanoseconds
	drop  atomic.Bool  // bytes are dropped, connections stay open
}

func newDelayLink(t *testing.T, target string) *delayLink {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &delayLink{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		defer dst.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 && !d.drop.Load() {
				time.Sleep(time.Duration(d.delay.Load()))
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, up)
			mu.Unlock()
			wg.Add(2)
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return d
}

func TestRequestShapes(t *testing.T) {
	tests := []struct {
		method, target, ua string
		verb, key, comp    string
	}{
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&resourceVersion=0&limit=500", kubeletUA, verbRead, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "kubelet"},
		{"GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&watch=true&resourceVersion=7&timeoutSeconds=300", kubeletUA, verbWatch, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "kubelet"},
		{"GET", "/api/v1/watch/namespaces/app/configmaps?fieldSelector=metadata.name%3Dx", "kube-proxy/v1", verbWatch, "/api/v1/namespaces/app/configmaps?fieldSelector=metadata.name%3Dx", "kube-proxy"},
		{"GET", "/apis/storage.k8s.io/v1/watch/csinodes", "", verbWatch, "/apis/storage.k8s.io/v1/csinodes", "unknown"},
		{"GET", "/api/v1/nodes/n1?resourceVersion=0", "../../etc", verbRead, "/api/v1/nodes/n1", "unknown"},
		{"POST", "/api/v1/namespaces/app/serviceaccounts/app/token", kubeletUA, verbToken, "/api/v1/namespaces/app/serviceaccounts/app/token", "kubelet"},
		{"POST", "/api/v1/namespaces/app/pods", kubeletUA, verbWrite, "/api/v1/namespaces/app/pods", "kubelet"},
		{"PATCH", "/api/v1/nodes/n1/status", "Kubelet Thing/2", verbWrite, "/api/v1/nodes/n1/status", "kubelet"},
	}
	for _, tt := range tests {
		r, err := http.NewRequest(tt.method, "http://local"+tt.target, nil)
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("User-Agent", tt.ua)
		if v, k, c := classify(r), keyOf(r), component(r); v != tt.verb || k != tt.key || c != tt.comp {
			t.Errorf("%s %s (%q): %s %s %s, want %s %s %s", tt.method, tt.target, tt.ua, v, k, c, tt.verb, tt.key, tt.comp)
		}
	}
}

func TestWithKind(t *testing.T) {
	for in, want := range map[string]string{
		`{"metadata":{"name":"a"}}`: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}`,
		`{}`:                        `{"apiVersion":"v1","kind":"Pod"}`,
		` { } `:                     `{"apiVersion":"v1","kind":"Pod"}`,
	} {
		if got := string(withKind([]byte(strings.TrimSpace(in)), "Pod", "v1")); got != want {
			t.Errorf("withKind(%s) = %s, want %s", in, got, want)
		}
	}
	for _, tt := range []struct {
		a, b string
		want bool
	}{{"5", "7", true}, {"7", "7", false}, {"0", "7", false}, {"", "7", false}, {"9", "7", false}} {
		if got := olderThan(tt.a, tt.b); got != tt.want {
			t.Errorf("olderThan(%q, %q) = %v", tt.a, tt.b, got)
		}
	}
}

// TestRetention: a record a component keeps asking for stays; one nobody
// asked for in the retention is dropped, from memory and disk; a use
// within the hour costs no write.
func TestRetention(t *testing.T) {
	dir := t.TempDir()
	m := newMetrics(prometheus.NewRegistry())
	log, _ := logging.New(logging.Config{Level: "error", Format: "text"}, t.Output())
	c, err := OpenCache(dir, 7*24*time.Hour, log, m)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.now = func() time.Time { return now }
	c.PutObject("kubelet", "/api/v1/nodes/n1", []byte(`{"kind":"Node"}`))
	c.PutObject("kubelet", "/api/v1/namespaces/app/secrets/gone", []byte(`{"kind":"Secret"}`))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	writes := written(m)
	now = now.Add(30 * time.Minute)
	c.Object("kubelet", "/api/v1/nodes/n1")
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := written(m); got != writes {
		t.Errorf("a use within the hour wrote %v records", got-writes)
	}
	for range 8 {
		now = now.Add(24 * time.Hour)
		c.Object("kubelet", "/api/v1/nodes/n1")
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := c.Object("kubelet", "/api/v1/nodes/n1"); !ok {
		t.Error("a record asked for every day was dropped")
	}
	if _, ok := c.Object("kubelet", "/api/v1/namespaces/app/secrets/gone"); ok {
		t.Error("a record nobody asked for in 8 days is kept")
	}
	if _, err := os.Stat(c.file(recID("kubelet", "/api/v1/namespaces/app/secrets/gone"))); !os.IsNotExist(err) {
		t.Errorf("the dropped record's file: %v, want it removed", err)
	}
	if got := testutil.ToFloat64(m.expired); got != 1 {
		t.Errorf("expired records counted: %v, want 1", got)
	}
}

// TestDiskFull fills the cache's file system (a 64 KiB tmpfs; needs
// root): the records that do not fit stay in memory and are answered,
// the failure is logged once and counted, and they are written once
// there is room again.
func TestDiskFull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	m := newMetrics(prometheus.NewRegistry())
	var logs strings.Builder
	log, _ := logging.New(logging.Config{Level: "info", Format: "text"}, &logs)
	c, err := OpenCache(dir, 0, log, m)
	if err != nil {
		t.Fatal(err)
	}
	big := `{"kind":"Secret","data":{"k":"` + strings.Repeat("x", 8<<10) + `"}}`
	for i := range 16 {
		c.PutObject("kubelet", fmt.Sprintf("/api/v1/namespaces/app/secrets/s%d", i), []byte(big))
	}
	for range 3 {
		if err := c.Flush(); err == nil {
			t.Fatal("16 records of 8 KiB fit in 64 KiB")
		}
	}
	if got := testutil.ToFloat64(m.writeErrors); got != 3 {
		t.Errorf("failed flushes counted: %v, want 3", got)
	}
	if n := strings.Count(logs.String(), "cannot write"); n != 1 {
		t.Errorf("the failure was logged %d times, want once:\n%s", n, logs.String())
	}
	for i := range 16 {
		if _, ok := c.Object("kubelet", fmt.Sprintf("/api/v1/namespaces/app/secrets/s%d", i)); !ok {
			t.Errorf("record s%d lost from memory", i)
		}
	}
	// Room again (the file system grows): everything is written.
	if out, err := exec.Command("mount", "-o", "remount,size=1m", dir).CombinedOutput(); err != nil {
		t.Fatalf("grow the tmpfs: %v: %s", err, out)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("flush with room: %v", err)
	}
	if !strings.Contains(logs.String(), "writing again") {
		t.Errorf("the recovery was not logged:\n%s", logs.String())
	}
	again, err := OpenCache(dir, 0, log, newMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 {
		if _, ok := again.Object("kubelet", fmt.Sprintf("/api/v1/namespaces/app/secrets/s%d", i)); !ok {
			t.Errorf("record s%d not on disk after the recovery", i)
		}
	}
}

// TestBookmarksWriteNothing: the bookmarks kube-apiserver sends every
// watch about once a minute move the kept list's resource version
// without a write; a change writes it, at its version.
func TestBookmarksWriteNothing(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	log, _ := logging.New(logging.Config{Level: "error", Format: "text"}, t.Output())
	c, err := OpenCache(t.TempDir(), 0, log, m)
	if err != nil {
		t.Fatal(err)
	}
	const key = "/api/v1/namespaces/app/secrets?fieldSelector=metadata.name%3Ds"
	c.PutList("kubelet", key, []byte(`{"kind":"SecretList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[]}`))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	before := written(m)
	for rv := 11; rv < 20; rv++ {
		c.Apply("kubelet", key, Event{Type: "BOOKMARK", Object: []byte(fmt.Sprintf(`{"kind":"Secret","apiVersion":"v1","metadata":{"resourceVersion":"%d"}}`, rv))})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if got := written(m) - before; got != 0 {
		t.Errorf("bookmarks wrote %v records", got)
	}
	if _, _, rv, _, _ := c.List("kubelet", key); rv != "19" {
		t.Errorf("list at %s after the bookmarks, want 19", rv)
	}
	c.Apply("kubelet", key, Event{Type: "ADDED", Object: []byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"namespace":"app","name":"s","resourceVersion":"20"}}`)})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := written(m) - before; got != 1 {
		t.Errorf("a change wrote %v records, want 1", got)
	}
	if got := testutil.ToFloat64(m.writes.WithLabelValues("kubelet", "secrets")); got != 2 {
		t.Errorf("writes of the kubelet's secrets counted %v, want 2 (the list, the change)", got)
	}
}

// written is every record write the cache counted.
func written(m *metrics) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { m.writes.Collect(ch); close(ch) }()
	sum := 0.0
	for c := range ch {
		var pb dto.Metric
		if err := c.Write(&pb); err == nil {
			sum += pb.GetCounter().GetValue()
		}
	}
	return sum
}

func TestResourceOf(t *testing.T) {
	for key, want := range map[string]string{
		"/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1":            "nodes",
		"/api/v1/nodes/edge-1":                                          "nodes",
		"/api/v1/namespaces/default/pods":                               "pods",
		"/api/v1/namespaces/default/configmaps/hello":                   "configmaps",
		"/api/v1/namespaces/default/serviceaccounts/default/token#ab12": "serviceaccounts/token",
		"/api/v1/namespaces":                                            "namespaces",
		"/api/v1/namespaces/default":                                    "namespaces",
		"/apis/storage.k8s.io/v1/csidrivers":                            "csidrivers",
		"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices":   "endpointslices",
		"/version": "other",
	} {
		if got := resourceOf(key); got != want {
			t.Errorf("resourceOf(%q) = %q, want %q", key, got, want)
		}
	}
}

// TestHeartbeatsWriteNothing: the kubelet's Node changing only in its
// heartbeat (resource version, managedFields, conditions'
// lastHeartbeatTime) is kept in memory and written with the next real
// change; a cache opened again on the same disk has the Node as last
// written.
func TestHeartbeatsWriteNothing(t *testing.T) {
	m := newMetrics(prometheus.NewRegistry())
	log, _ := logging.New(logging.Config{Level: "error", Format: "text"}, t.Output())
	dir := t.TempDir()
	c, err := OpenCache(dir, 0, log, m)
	if err != nil {
		t.Fatal(err)
	}
	node := func(rv, beat, label string) []byte {
		return []byte(fmt.Sprintf(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"edge-1","resourceVersion":%q,"labels":{"l":%q},
			"managedFields":[{"manager":"kubelet","time":%q}]},"status":{"conditions":[{"type":"Ready","status":"True","lastHeartbeatTime":%q,"lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`, rv, label, beat, beat))
	}
	const list, object = "/api/v1/nodes?fieldSelector=metadata.name%3Dedge-1", "/api/v1/nodes/edge-1"
	c.PutList("kubelet", list, []byte(`{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"10"},"items":[`+string(node("10", "2026-01-01T00:00:00Z", "a"))+`]}`))
	c.PutObject("kubelet", object, node("10", "2026-01-01T00:00:00Z", "a"))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	before := written(m)
	for i := 1; i <= 5; i++ {
		rv, beat := fmt.Sprint(10+i), fmt.Sprintf("2026-01-01T00:00:%02dZ", 10*i)
		c.Apply("kubelet", list, Event{Type: "MODIFIED", Object: node(rv, beat, "a")})
		c.PutObject("kubelet", object, node(rv, beat, "a"))
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	if got := written(m) - before; got != 0 {
		t.Errorf("heartbeats wrote %v records", got)
	}
	if body, ok := c.Object("kubelet", object); !ok || !strings.Contains(string(body), `"resourceVersion":"15"`) {
		t.Errorf("the Node in memory is not the last one read: %s", body)
	}
	if _, _, rv, _, _ := c.List("kubelet", list); rv != "15" {
		t.Errorf("list at %s, want 15", rv)
	}

	// A power cut now: the disk has the Node as first written.
	again, err := OpenCache(dir, 0, log, newMetrics(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	if body, ok := again.Object("kubelet", object); !ok || !strings.Contains(string(body), `"resourceVersion":"10"`) {
		t.Errorf("the Node on disk: %s", body)
	}

	// A real change (a label) is written, with the heartbeats before it.
	c.Apply("kubelet", list, Event{Type: "MODIFIED", Object: node("16", "2026-01-01T00:01:00Z", "b")})
	c.PutObject("kubelet", object, node("16", "2026-01-01T00:01:00Z", "b"))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := written(m) - before; got != 2 {
		t.Errorf("a label change wrote %v records, want 2 (the list, the object)", got)
	}
}
