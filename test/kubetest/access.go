package kubetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// RESTConfig returns a copy of the admin (system:masters) client config,
// with a high client-side QPS and burst.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.restConfig) }

// Client returns an admin clientset.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// KubeconfigPath is the admin kubeconfig file (certificates by path).
func (c *Cluster) KubeconfigPath() string { return c.kubeconfigPath }

// APIServerURL is the apiserver's https URL on 127.0.0.1.
func (c *Cluster) APIServerURL() string { return c.apiServerURL }

// EtcdURL is etcd's client URL on 127.0.0.1.
func (c *Cluster) EtcdURL() string { return c.etcdURL }

// BinDir is the directory the binaries were run from.
func (c *Cluster) BinDir() string { return c.cfg.BinDir }

// Dir holds the cluster's data, certificates, kubeconfig and logs.
func (c *Cluster) Dir() string { return c.dir }

// Config is the defaulted configuration the cluster was started with.
func (c *Cluster) Config() Config { return c.cfg }

// CABundle is the PEM of the cluster CA. The apiserver's serving certificate
// and every certificate from IssueServingCert chain to it, so it is the
// caBundle for webhook configurations and APIServices served by tests.
func (c *Cluster) CABundle() []byte { return append([]byte(nil), c.ca.certPEM...) }

// CAFile is the path of the cluster CA certificate.
func (c *Cluster) CAFile() string { return c.path("pki", "ca.crt") }

// IssueServingCert returns a serving certificate and key (PEM) for hosts (IP
// addresses and DNS names), signed by the cluster CA.
func (c *Cluster) IssueServingCert(hosts ...string) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		return nil, nil, fmt.Errorf("issue serving cert: no hosts")
	}
	return c.ca.issue(servingRequest(hosts...))
}

// IssueClientCert returns a client certificate and key (PEM) for the
// user commonName in the groups organization, signed by the cluster's
// CA (which the apiserver and real kubelets trust).
func (c *Cluster) IssueClientCert(commonName string, organization ...string) (certPEM, keyPEM []byte, err error) {
	return c.ca.issueClient(commonName, organization...)
}

// WriteServingCert writes tls.crt and tls.key for hosts into dir (the
// layout controller-runtime's webhook server reads by default).
func (c *Cluster) WriteServingCert(dir string, hosts ...string) error {
	cert, key, err := c.IssueServingCert(hosts...)
	if err != nil {
		return err
	}
	return writeFiles(dir, map[string][]byte{"tls.crt": cert, "tls.key": key})
}

// CreateNamespace creates namespace name and, when kube-controller-manager
// runs, waits for its default ServiceAccount so pods can be created in it.
func (c *Cluster) CreateNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	if !c.cfg.ControllerManager {
		return nil
	}
	return c.WaitForServiceAccount(ctx, name)
}

// LogPath is the log file of component (e.g. "kube-apiserver").
func (c *Cluster) LogPath(component string) string { return c.path("logs", component+".log") }

// LogTails returns the last n lines of every component's log, each under a
// header naming the file.
func (c *Cluster) LogTails(n int) string {
	c.mu.Lock()
	procs := append([]*process(nil), c.procs...)
	c.mu.Unlock()
	var b strings.Builder
	seen := map[string]bool{}
	for _, p := range procs {
		if seen[p.logPath] {
			continue
		}
		seen[p.logPath] = true
		fmt.Fprintf(&b, "--- last %d lines of %s ---\n%s\n", n, filepath.Base(p.logPath), p.tail(n))
	}
	return b.String()
}

// ServiceAccountConfig returns a client config that authenticates only as
// the ServiceAccount namespace/name: a bearer token the apiserver issued
// through the TokenRequest API (valid for expiry, at least 10 minutes) and
// the cluster CA, nothing else, so every request is authorized as that
// account exactly as in a pod. The ServiceAccount must exist.
func (c *Cluster) ServiceAccountConfig(ctx context.Context, namespace, name string, expiry time.Duration) (*rest.Config, error) {
	seconds := int64(expiry / time.Second)
	tr, err := c.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token request for serviceaccount %s/%s: %w", namespace, name, err)
	}
	return &rest.Config{
		Host:            c.apiServerURL,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CABundle()},
		QPS:             clientQPS,
		Burst:           clientBurst,
	}, nil
}

// ServiceAccountUser is the user name the apiserver gives the
// ServiceAccount namespace/name (what audit events and RBAC subjects name).
func ServiceAccountUser(namespace, name string) string {
	return "system:serviceaccount:" + namespace + ":" + name
}

// PauseAPIServer stops kube-apiserver with SIGSTOP, as a host that hangs
// does: its connections stay open and nothing answers. It returns a
// function that resumes it (SIGCONT); a test that pauses must resume.
func (c *Cluster) PauseAPIServer() (resume func() error, err error) {
	return c.pause(binAPIServer)
}

// pause stops component's process group with SIGSTOP and returns the
// function that resumes it.
func (c *Cluster) pause(component string) (func() error, error) {
	c.mu.Lock()
	var p *process
	for _, q := range c.procs {
		if q.name == component {
			p = q
		}
	}
	c.mu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("kubetest: pause: %s is not running", component)
	}
	if done, err := p.exited(); done {
		return nil, fmt.Errorf("kubetest: pause: %w", err)
	}
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		return nil, fmt.Errorf("kubetest: pause %s: %w", component, err)
	}
	var once sync.Once
	var cerr error
	return func() error {
		once.Do(func() {
			if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGCONT); err != nil {
				cerr = fmt.Errorf("kubetest: resume %s: %w", component, err)
			}
		})
		return cerr
	}, nil
}

// Restart kills component (etcd, kube-apiserver, kube-controller-manager
// or kube-scheduler) with SIGKILL, as a host that crashes does, and starts
// it again with the same flags, ports and log. It returns once the new
// process serves (kube-apiserver: /readyz; the others: still running a
// second later).
func (c *Cluster) Restart(ctx context.Context, component string) error {
	c.mu.Lock()
	i := slices.IndexFunc(c.procs, func(p *process) bool { return p.name == component })
	var old *process
	if i >= 0 {
		old = c.procs[i]
	}
	c.mu.Unlock()
	if old == nil {
		return fmt.Errorf("kubetest: restart: %s is not running", component)
	}
	_ = syscall.Kill(-old.cmd.Process.Pid, syscall.SIGKILL)
	<-old.done
	p, err := startProcess(component, old.cmd.Path, old.cmd.Args[1:], old.logPath)
	if err != nil {
		return fmt.Errorf("kubetest: restart: %w", err)
	}
	c.mu.Lock()
	c.procs[i] = p
	c.mu.Unlock()
	ready := func(ctx context.Context) error {
		if done, err := p.exited(); done {
			return err
		}
		if component == binAPIServer {
			return apiServerReady(ctx, c.restConfig)
		}
		return nil
	}
	if component != binAPIServer {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	for {
		err := ready(ctx)
		if err == nil {
			c.log.Info("kubetest: restarted", "component", component)
			return nil
		}
		if done, _ := p.exited(); done {
			return fmt.Errorf("kubetest: restart: %w\n%s", err, p.tail(30))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: restart %s: %w (last: %v)", component, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CPU is the CPU time (user and system) each running component (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler) has used so
// far, by name, read from /proc: benchmarks subtract two readings.
func (c *Cluster) CPU() map[string]time.Duration {
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	out := map[string]time.Duration{}
	for _, p := range procs {
		if p.cmd.Process != nil {
			out[p.name] += ProcessCPU(p.cmd.Process.Pid)
		}
	}
	return out
}

// ProcessCPU is the CPU time (user and system) process pid has used so
// far, from /proc/PID/stat (0: gone).
func ProcessCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil || pid == 0 {
		return 0
	}
	// The fields after the command, which may hold spaces, in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	user, _ := strconv.ParseInt(f[11], 10, 64)
	sys, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(user+sys) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat's times.
const clockTicks = 100
