package localapi

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/test/kubetest"
)

// BenchmarkRequestOverhead measures what the local API endpoint adds to a
// request of the node's components (go tool task bench:autonomy): the
// kubelet's GET of its own Node (protobuf), sent straight to a real
// kube-apiserver with the node's credentials and through the endpoint
// online, alternately (no client-side rate limit on either); it reports
// each path's median and 99th percentile and the median's difference.
func BenchmarkRequestOverhead(b *testing.B) {
	cluster := kubetest.Start(b)
	ctx := b.Context()
	if _, err := cluster.Client().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	pki := nodeCredentials(b, cluster, "n1")
	s, _ := localAPI(b, cluster.APIServerURL(), cluster.CAFile(), pki, b.TempDir())
	through := clientOf(b, s, kubeletUA)
	rc := cluster.RESTConfig()
	rc.CertFile, rc.KeyFile, rc.CertData, rc.KeyData = pki+"/node.crt", pki+"/node.key", nil, nil
	rc.ContentType, rc.UserAgent, rc.QPS = "application/vnd.kubernetes.protobuf", kubeletUA, -1
	direct, err := kubernetes.NewForConfig(rest.CopyConfig(rc))
	if err != nil {
		b.Fatal(err)
	}
	get := func(c kubernetes.Interface) time.Duration {
		begin := time.Now()
		if _, err := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
			b.Fatal(err)
		}
		return time.Since(begin)
	}
	for range 50 { // connections up, caches warm
		get(direct)
		get(through)
	}
	var d, l []time.Duration
	for b.Loop() {
		d = append(d, get(direct))
		l = append(l, get(through))
	}
	q := func(xs []time.Duration, p float64) float64 {
		slices.Sort(xs)
		return float64(xs[int(p*float64(len(xs)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(d, 0.5), "direct-p50-ms")
	b.ReportMetric(q(d, 0.99), "direct-p99-ms")
	b.ReportMetric(q(l, 0.5), "local-p50-ms")
	b.ReportMetric(q(l, 0.99), "local-p99-ms")
	b.ReportMetric(q(l, 0.5)-q(d, 0.5), "overhead-p50-ms")
}
