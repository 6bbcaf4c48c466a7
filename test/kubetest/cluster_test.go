package kubetest_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/atoll-edge/atoll/test/kubetest"
)

func TestStartAPIServer(t *testing.T) {
	begin := time.Now()
	c := kubetest.Start(t)
	t.Logf("etcd + kube-apiserver ready in %s", time.Since(begin).Round(time.Millisecond))
	ctx := t.Context()

	v, err := c.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("server version: %v", err)
	}
	if v.GitVersion != "v1.36.3" {
		t.Errorf("server version = %s, want v1.36.3", v.GitVersion)
	}

	// The kubeconfig on disk works on its own.
	rc, err := clientcmd.BuildConfigFromFlags("", c.KubeconfigPath())
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatalf("client from kubeconfig: %v", err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"k": "v"}}
	if _, err := client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}

	// The admin identity is in system:masters.
	review, err := c.Client().AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("self subject review: %v", err)
	}
	if !slices.Contains(review.Status.UserInfo.Groups, "system:masters") {
		t.Errorf("admin groups = %v, want system:masters", review.Status.UserInfo.Groups)
	}

	// The flags the node lifecycle tests rely on are in effect.
	if got := c.Config().UnreachableTolerationSeconds; got != kubetest.DefaultTolerationSeconds {
		t.Errorf("UnreachableTolerationSeconds = %d, want %d", got, kubetest.DefaultTolerationSeconds)
	}
}

func TestCABundle(t *testing.T) {
	c := kubetest.Start(t)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(c.CABundle()) {
		t.Fatal("CABundle holds no certificate")
	}

	// The apiserver's serving certificate chains to the bundle.
	conn, err := tls.Dial("tcp", strings.TrimPrefix(c.APIServerURL(), "https://"), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatalf("dial apiserver with CABundle: %v", err)
	}
	conn.Close()

	// So does a serving certificate issued for a test server (a webhook).
	certPEM, keyPEM, err := c.IssueServingCert("127.0.0.1", "webhook.default.svc")
	if err != nil {
		t.Fatalf("issue serving cert: %v", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("load serving cert: %v", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok"))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatalf("GET webhook server with CABundle: %v", err)
	}
	resp.Body.Close()

	dir := t.TempDir()
	if err := c.WriteServingCert(dir, "127.0.0.1"); err != nil {
		t.Fatalf("write serving cert: %v", err)
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Fatalf("load written serving cert: %v", err)
	}
}

func TestStartClusterMissingBinary(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := kubetest.StartCluster(ctx, kubetest.Config{BinDir: t.TempDir(), Dir: t.TempDir()})
	if !errors.Is(err, kubetest.ErrBinaryMissing) {
		t.Fatalf("StartCluster with empty bin dir: err = %v, want ErrBinaryMissing", err)
	}
	if !strings.Contains(err.Error(), "go tool task kube:build") {
		t.Errorf("error %q does not say how to build the binaries", err)
	}
}

func TestFindBinDir(t *testing.T) {
	t.Run("repo", func(t *testing.T) {
		t.Setenv(kubetest.BinDirEnv, "")
		dir, err := kubetest.FindBinDir()
		if err != nil {
			t.Fatalf("FindBinDir: %v", err)
		}
		root := filepath.Dir(dir)
		if _, err := os.Stat(filepath.Join(root, "test", "kubetest")); err != nil || filepath.Base(dir) != "bin" {
			t.Errorf("FindBinDir = %s, want <repo>/bin", dir)
		}
	})
	t.Run("env", func(t *testing.T) {
		want := t.TempDir()
		t.Setenv(kubetest.BinDirEnv, want)
		if dir, err := kubetest.FindBinDir(); err != nil || dir != want {
			t.Errorf("FindBinDir = %s, %v; want %s", dir, err, want)
		}
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		cfg     kubetest.Config
		wantErr string
	}{
		{name: "defaults", cfg: kubetest.Config{}},
		{name: "bad range", cfg: kubetest.Config{ServiceClusterIPRange: "10.96.0.0"}, wantErr: "ServiceClusterIPRange"},
		{name: "tiny range", cfg: kubetest.Config{ServiceClusterIPRange: "10.96.0.0/30"}, wantErr: "ServiceClusterIPRange"},
		{name: "grace below period", cfg: kubetest.Config{NodeMonitorPeriod: 2 * time.Second, NodeMonitorGracePeriod: time.Second}, wantErr: "NodeMonitorGracePeriod"},
		{name: "negative eviction rate", cfg: kubetest.Config{NodeEvictionRate: -1}, wantErr: "NodeEvictionRate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			tt.cfg.BinDir = t.TempDir() // no binaries: a valid config fails later, on the binaries
			_, err := kubetest.StartCluster(ctx, tt.cfg)
			if tt.wantErr == "" {
				if !errors.Is(err, kubetest.ErrBinaryMissing) {
					t.Fatalf("err = %v, want only ErrBinaryMissing", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
			}
		})
	}
}

func TestStartControlPlane(t *testing.T) {
	begin := time.Now()
	c := kubetest.Start(t, kubetest.WithControllerManager(), kubetest.WithScheduler())
	t.Logf("etcd + kube-apiserver + kube-controller-manager + kube-scheduler ready in %s", time.Since(begin).Round(time.Millisecond))

	// The serviceaccount controller runs: a new namespace gets its default
	// ServiceAccount, and the root CA publisher its kube-root-ca.crt.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.CreateNamespace(ctx, "probe"); err != nil {
		t.Fatal(err)
	}
	if err := poll.Until(ctx, func(ctx context.Context) error {
		_, err := c.Client().CoreV1().ConfigMaps("probe").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("kube-root-ca.crt: %v", err)
	}
}
