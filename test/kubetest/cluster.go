package kubetest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Client-side rate limits of the clients the Cluster hands out. Tests and
// simulators should never wait on a client-side limiter.
const (
	clientQPS   = 1000
	clientBurst = 2000
)

// Cluster is a running control plane on loopback.
type Cluster struct {
	cfg     Config
	dir     string
	ownsDir bool
	log     *slog.Logger

	ca             *authority
	apiServerURL   string
	etcdURL        string
	kubeconfigPath string
	restConfig     *rest.Config
	client         kubernetes.Interface

	mu    sync.Mutex
	procs []*process // in start order

	stopOnce sync.Once
	stopErr  error
}

// StartCluster starts etcd and kube-apiserver, then (as configured)
// kube-controller-manager and kube-scheduler, and returns once each is ready.
// ctx bounds the start only; the processes run until Stop.
func StartCluster(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kubetest config: %w", err)
	}
	if cfg.BinDir == "" {
		if cfg.BinDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	need := []string{binEtcd, binAPIServer}
	if cfg.ControllerManager {
		need = append(need, binControllerManager)
	}
	if cfg.Scheduler {
		need = append(need, binScheduler)
	}
	if err := checkBinaries(cfg.BinDir, need...); err != nil {
		return nil, err
	}

	c := &Cluster{cfg: cfg, dir: cfg.Dir, log: cfg.Logger}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kubetest-"); err != nil {
			return nil, fmt.Errorf("create cluster dir: %w", err)
		}
		c.ownsDir = true
	}
	defer func() {
		if err != nil {
			_ = c.Stop()
		}
	}()

	ctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	begin := time.Now()

	if err := c.writePKI(); err != nil {
		return nil, err
	}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}

	// The controller manager and the scheduler only need the apiserver;
	// start them side by side.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	if cfg.ControllerManager {
		wg.Go(func() { errs[0] = c.startControllerManager(ctx) })
	}
	if cfg.Scheduler {
		wg.Go(func() { errs[1] = c.startScheduler(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.log.Info("kubetest: cluster ready", "elapsed", time.Since(begin).Round(time.Millisecond),
		"apiserver", c.apiServerURL, "dir", c.dir)
	return c, nil
}

// path returns a path inside the cluster directory.
func (c *Cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.dir}, elem...)...)
}

// writePKI creates the CA, the apiserver serving certificate, the admin
// client certificate and the service-account signing key.
func (c *Cluster) writePKI() error {
	ca, err := newAuthority()
	if err != nil {
		return err
	}
	c.ca = ca
	svcIP, err := firstServiceIP(c.cfg.ServiceClusterIPRange)
	if err != nil {
		return err
	}
	serving := servingRequest(append([]string{"127.0.0.1", "localhost", "::1", svcIP.String(),
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"}, c.cfg.APIServerSANs...)...)
	serving.commonName = "kube-apiserver"
	servingCert, servingKey, err := ca.issue(serving)
	if err != nil {
		return err
	}
	adminCert, adminKey, err := ca.issueClient("kubetest-admin", "system:masters")
	if err != nil {
		return err
	}
	// The apiserver's own identity towards kubelets (logs, exec, port
	// forwards of real nodes).
	kubeletClientCert, kubeletClientKey, err := ca.issueClient("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return err
	}
	saKey, saPub, err := serviceAccountKey()
	if err != nil {
		return err
	}
	if err := writeFiles(c.path("pki"), map[string][]byte{
		"ca.crt": ca.certPEM, "ca.key": ca.keyPEM,
		"apiserver.crt": servingCert, "apiserver.key": servingKey,
		"admin.crt": adminCert, "admin.key": adminKey,
		"apiserver-kubelet-client.crt": kubeletClientCert, "apiserver-kubelet-client.key": kubeletClientKey,
		"sa.key": saKey, "sa.pub": saPub,
	}); err != nil {
		return fmt.Errorf("write pki: %w", err)
	}
	return os.MkdirAll(c.path("logs"), 0o700)
}

// firstServiceIP is the kubernetes Service's ClusterIP: the range's first
// usable address.
func firstServiceIP(cidr string) (netip.Addr, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("service cluster ip range: %w", err)
	}
	return p.Masked().Addr().Next(), nil
}

func (c *Cluster) track(p *process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs = append(c.procs, p)
}

// launch runs one component via runUntilReady and records its process.
func (c *Cluster) launch(ctx context.Context, name string, nports int, args func(ports []int) []string, ready func(ctx context.Context, ports []int) error) ([]int, error) {
	begin := time.Now()
	bin := filepath.Join(c.cfg.BinDir, name)
	logPath := c.path("logs", name+".log")
	p, ports, err := runUntilReady(ctx, nports, func(ports []int) (*process, error) {
		return startProcess(name, bin, args(ports), logPath)
	}, ready)
	if p != nil {
		c.track(p)
	}
	if err != nil {
		tail := ""
		if p != nil {
			tail = "\n--- last lines of " + logPath + " ---\n" + p.tail(30)
		}
		return nil, fmt.Errorf("start %s: %w%s", name, err, tail)
	}
	c.log.Info("kubetest: started", "component", name, "elapsed", time.Since(begin).Round(time.Millisecond))
	return ports, nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	dataDir := c.path("etcd")
	ports, err := c.launch(ctx, binEtcd, 2, func(ports []int) []string {
		client, peer := loopbackURL("http", ports[0]), loopbackURL("http", ports[1])
		return []string{
			"--name=kubetest",
			"--data-dir=" + dataDir,
			"--listen-client-urls=" + client,
			"--advertise-client-urls=" + client,
			"--listen-peer-urls=" + peer,
			"--initial-advertise-peer-urls=" + peer,
			"--initial-cluster=kubetest=" + peer,
			"--initial-cluster-state=new",
			"--unsafe-no-fsync",
			"--log-level=warn",
		}
	}, func(ctx context.Context, ports []int) error {
		return httpOK(ctx, http.DefaultClient, loopbackURL("http", ports[0])+"/health", `"health":"true"`)
	})
	if err != nil {
		return err
	}
	c.etcdURL = loopbackURL("http", ports[0])
	return nil
}

func (c *Cluster) apiServerArgs(port int) []string {
	pki := c.path("pki")
	args := []string{
		"--advertise-address=127.0.0.1",
		"--bind-address=" + c.cfg.APIServerBindAddress,
		"--secure-port=" + strconv.Itoa(port),
		"--etcd-servers=" + c.etcdURL,
		"--cert-dir=" + c.path("apiserver"),
		"--tls-cert-file=" + filepath.Join(pki, "apiserver.crt"),
		"--tls-private-key-file=" + filepath.Join(pki, "apiserver.key"),
		"--client-ca-file=" + filepath.Join(pki, "ca.crt"),
		"--kubelet-client-certificate=" + filepath.Join(pki, "apiserver-kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(pki, "apiserver-kubelet-client.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=" + c.cfg.ServiceClusterIPRange,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--default-not-ready-toleration-seconds=" + strconv.Itoa(c.cfg.NotReadyTolerationSeconds),
		"--default-unreachable-toleration-seconds=" + strconv.Itoa(c.cfg.UnreachableTolerationSeconds),
		"--profiling=false",
	}
	return append(args, c.cfg.ExtraAPIServerFlags...)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	var rc *rest.Config
	egress, err := c.egressArgs()
	if err != nil {
		return err
	}
	ports, err := c.launch(ctx, binAPIServer, 1, func(ports []int) []string {
		return append(c.apiServerArgs(ports[0]), egress...)
	}, func(ctx context.Context, ports []int) error {
		if rc == nil || rc.Host != loopbackURL("https", ports[0]) {
			rc = c.adminRESTConfig(loopbackURL("https", ports[0]))
		}
		return apiServerReady(ctx, rc)
	})
	if err != nil {
		return err
	}
	c.apiServerURL = loopbackURL("https", ports[0])
	c.restConfig = c.adminRESTConfig(c.apiServerURL)
	if c.client, err = kubernetes.NewForConfig(c.restConfig); err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	c.kubeconfigPath = c.path("admin.kubeconfig")
	if err := clientcmd.WriteToFile(c.kubeconfig(), c.kubeconfigPath); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// apiServerReady polls /readyz and then waits for the default namespace,
// which the apiserver creates shortly after it turns ready.
func apiServerReady(ctx context.Context, rc *rest.Config) error {
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("readyz: %w: %s", err, body)
	}
	if _, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{}); err != nil {
		return fmt.Errorf("namespace default: %w", err)
	}
	return nil
}

func (c *Cluster) adminRESTConfig(host string) *rest.Config {
	pki := c.path("pki")
	return &rest.Config{
		Host: host,
		TLSClientConfig: rest.TLSClientConfig{
			CAFile:   filepath.Join(pki, "ca.crt"),
			CertFile: filepath.Join(pki, "admin.crt"),
			KeyFile:  filepath.Join(pki, "admin.key"),
		},
		QPS:   clientQPS,
		Burst: clientBurst,
		// Tests use the v1 Endpoints API on purpose: no "deprecated"
		// warning on every call.
		WarningHandler: rest.NoWarnings{},
	}
}

func (c *Cluster) kubeconfig() clientcmdapi.Config {
	pki := c.path("pki")
	const name = "kubetest"
	return clientcmdapi.Config{
		Clusters: map[string]*clientcmdapi.Cluster{name: {
			Server:               c.apiServerURL,
			CertificateAuthority: filepath.Join(pki, "ca.crt"),
		}},
		AuthInfos: map[string]*clientcmdapi.AuthInfo{name: {
			ClientCertificate: filepath.Join(pki, "admin.crt"),
			ClientKey:         filepath.Join(pki, "admin.key"),
		}},
		Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: name, AuthInfo: name}},
		CurrentContext: name,
	}
}

// componentArgs are the flags kube-controller-manager and kube-scheduler
// share: admin kubeconfig for everything, secure port on loopback with a
// self-signed certificate, no leader election.
func (c *Cluster) componentArgs(name string, port int) []string {
	return []string{
		"--kubeconfig=" + c.kubeconfigPath,
		"--authentication-kubeconfig=" + c.kubeconfigPath,
		"--authorization-kubeconfig=" + c.kubeconfigPath,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + c.path(name),
		"--leader-elect=false",
		"--profiling=false",
	}
}

func (c *Cluster) controllerManagerArgs(port int) []string {
	pki := c.path("pki")
	args := append(c.componentArgs(binControllerManager, port),
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"),
		"--root-ca-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-cert-file="+filepath.Join(pki, "ca.crt"),
		"--cluster-signing-key-file="+filepath.Join(pki, "ca.key"),
		// Each controller under its own service account, as kubeadm
		// runs it: the webhook's guard tells the node lifecycle
		// controller by its identity.
		"--use-service-account-credentials=true",
		"--node-monitor-period="+c.cfg.NodeMonitorPeriod.String(),
		"--node-monitor-grace-period="+c.cfg.NodeMonitorGracePeriod.String(),
		"--node-eviction-rate="+strconv.FormatFloat(c.cfg.NodeEvictionRate, 'g', -1, 64),
		"--kube-api-qps=500",
		"--kube-api-burst=1000",
	)
	return append(args, c.cfg.ExtraControllerManagerFlags...)
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	_, err := c.launch(ctx, binControllerManager, 1, func(ports []int) []string {
		return c.controllerManagerArgs(ports[0])
	}, func(ctx context.Context, ports []int) error {
		return httpOK(ctx, insecureClient, loopbackURL("https", ports[0])+"/healthz", "ok")
	})
	if err != nil {
		return err
	}
	// Pods need their namespace's default ServiceAccount; wait until the
	// serviceaccount controller made the first one.
	return c.WaitForServiceAccount(ctx, metav1.NamespaceDefault)
}

func (c *Cluster) schedulerArgs(port int) []string {
	args := append(c.componentArgs(binScheduler, port), "--kube-api-qps=200", "--kube-api-burst=400")
	return append(args, c.cfg.ExtraSchedulerFlags...)
}

func (c *Cluster) startScheduler(ctx context.Context) error {
	_, err := c.launch(ctx, binScheduler, 1, func(ports []int) []string {
		return c.schedulerArgs(ports[0])
	}, func(ctx context.Context, ports []int) error {
		return httpOK(ctx, insecureClient, loopbackURL("https", ports[0])+"/readyz", "ok")
	})
	return err
}

// insecureClient probes the components' self-signed secure ports.
var insecureClient = &http.Client{Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // loopback health probe
}}

// httpOK GETs url and wants status 200 and a body containing want.
func httpOK(ctx context.Context, client *http.Client, url, want string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return nil
}

// WaitForServiceAccount waits until the default ServiceAccount exists in
// namespace (made by kube-controller-manager), so pods can be created there.
func (c *Cluster) WaitForServiceAccount(ctx context.Context, namespace string) error {
	err := poll.Until(ctx, func(ctx context.Context) error {
		_, err := c.client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("wait for serviceaccount %s/default: %w", namespace, err)
	}
	return nil
}

// Stop stops the processes in reverse start order (SIGTERM, then SIGKILL
// after Config.StopTimeout) and removes the directory if StartCluster made
// it. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		procs := c.procs
		c.mu.Unlock()
		var errs []error
		for i := len(procs) - 1; i >= 0; i-- {
			if err := procs[i].stop(c.cfg.StopTimeout); err != nil {
				errs = append(errs, err)
			}
		}
		if c.ownsDir {
			if err := os.RemoveAll(c.dir); err != nil {
				errs = append(errs, fmt.Errorf("remove cluster dir: %w", err))
			}
		}
		c.stopErr = errors.Join(errs...)
	})
	return c.stopErr
}
