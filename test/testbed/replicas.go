package testbed

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/test/gobuild"
	"github.com/atoll-edge/atoll/test/natstest"
)

// Replicas run atoll-cloud as deployed: the services/atoll-cloud binary,
// each replica in a process of its own, configured by its command-line
// flags only (the bed's configuration rendered as flags: CloudArgs), so
// that a test can SIGKILL one and start it again as the kubelet restarts
// a container. Each replica's leader election identity is its name, as
// the manifests set the pod's name: a replica restarted under its name
// takes back the Lease it held.
//
// The apiserver reaches the replicas' webhooks through one address, as
// through the webhook's Service: a TCP proxy on the bed's webhook port
// that sends each connection to the replicas in turn, skipping those
// that refuse it (a dead process). It sends connections to a replica
// that runs but is not ready yet too, as a Service may for the moments
// before a restarted container's readiness probe fails: the hostile
// case.

// Replica is one atoll-cloud process.
type Replica struct {
	Name string
	// AdminURL is its admin listener (http://127.0.0.1:port).
	AdminURL string

	bed     *Bed
	args    []string
	env     []string
	logPath string
	webhook string // its webhook's address, behind the proxy

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// CloudArgs renders cfg as atoll-cloud's command line: every flag whose
// value differs from the production default. The Kubernetes client
// configuration is not a flag: the caller adds --kubeconfig.
func CloudArgs(cfg cloudapp.Config) []string {
	def := cloudapp.Default()
	dfs := flag.NewFlagSet("default", flag.ContinueOnError)
	def.RegisterFlags(dfs)
	fs := flag.NewFlagSet("bed", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	var args []string
	fs.VisitAll(func(f *flag.Flag) {
		if v := f.Value.String(); v != dfs.Lookup(f.Name).Value.String() {
			args = append(args, "--"+f.Name+"="+v)
		}
	})
	return args
}

// StartReplicas replaces the in-process atoll-cloud (stopped gracefully
// first) with n replicas of the atoll-cloud binary, named replica-0 …,
// with the bed's configuration changed by adjust (if not nil), and
// returns once each is ready. With the embedded hub, n must be 1:
// the replica runs the hub on the ports, store and identity keys of the
// in-process one. Health, HubLink, Identity, Admin and Hub are nil from
// then on: read the cluster, the hub and the replicas' admin endpoints.
func (b *Bed) StartReplicas(ctx context.Context, n int, adjust func(*cloudapp.Config)) ([]*Replica, error) {
	embedded := b.cloudCfg.EmbeddedHub()
	if n < 1 || (embedded && n != 1) {
		return nil, fmt.Errorf("testbed: %d replicas (the embedded hub runs in one)", n)
	}
	if len(b.replicas) > 0 {
		return nil, errors.New("testbed: replicas run already")
	}
	bin, err := gobuild.Binary(ctx, "services/atoll-cloud")
	if err != nil {
		return nil, err
	}
	cfg := b.cloudCfg
	if adjust != nil {
		adjust(&cfg)
	}
	if embedded {
		client, err := urlPort(b.Hub.ClientURL())
		if err != nil {
			return nil, err
		}
		leaf, err := urlPort(b.Hub.LeafURLs()[0])
		if err != nil {
			return nil, err
		}
		cfg.Hub.ClientPort, cfg.Hub.LeafPort = client, leaf
		b.leafURLs = b.Hub.LeafURLs()
		b.hubURL = b.Hub.ClientURL()
	}
	kubeconfig := filepath.Join(b.dir, "atoll-cloud.kubeconfig")
	if err := writeKubeconfig(kubeconfig, cfg.Kube.REST); err != nil {
		return nil, err
	}
	if err := b.StopCloud(ctx); err != nil {
		return nil, fmt.Errorf("testbed: stop the in-process atoll-cloud: %w", err)
	}
	b.Health, b.HubLink, b.Identity, b.Admin, b.Hub = nil, nil, nil, nil, nil

	// The webhook's Service.
	lb, err := listenProxy(cfg.Webhook.Addr)
	if err != nil {
		return nil, err
	}
	b.proxy = lb
	b.stops = append(b.stops, lb.close)
	for i := range n {
		ports := make([]int, 2)
		for j := range ports {
			if ports[j], err = natstest.FreePort(); err != nil {
				return nil, err
			}
		}
		rc := cfg
		rc.Admin.Addr = fmt.Sprintf("127.0.0.1:%d", ports[0])
		rc.Webhook.Addr = fmt.Sprintf("127.0.0.1:%d", ports[1])
		r := &Replica{
			Name:     fmt.Sprintf("replica-%d", i),
			AdminURL: "http://" + rc.Admin.Addr,
			bed:      b,
			webhook:  rc.Webhook.Addr,
		}
		rc.Manager.Identity = r.Name
		r.args = append(CloudArgs(rc), "--kubeconfig="+kubeconfig, "--log-format=json")
		r.logPath = filepath.Join(b.dir, "atoll-cloud-"+r.Name+".log")
		r.env = append(os.Environ(), "GOTRACEBACK=all")
		b.replicas = append(b.replicas, r)
		lb.add(r.webhook)
		b.stops = append(b.stops, func() { _ = r.Stop(10 * time.Second) })
		if err := r.start(bin); err != nil {
			return nil, err
		}
	}
	for _, r := range b.replicas {
		if err := r.WaitReady(ctx); err != nil {
			return nil, err
		}
	}
	return b.replicas, nil
}

// Replicas are the running replicas (StartReplicas).
func (b *Bed) Replicas() []*Replica { return b.replicas }

func (r *Replica) start(bin string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		select {
		case <-r.done:
		default:
			return fmt.Errorf("testbed: %s runs", r.Name)
		}
	}
	logFile, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "### %s %s %q\n", time.Now().Format(time.RFC3339Nano), bin, r.args)
	cmd := exec.Command(bin, r.args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = logFile, logFile, r.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return fmt.Errorf("testbed: start %s: %w", r.Name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(done)
	}()
	r.cmd, r.done = cmd, done
	return nil
}

// Restart starts a replica that was killed or stopped again, with the
// same flags (a container restarted in its pod).
func (r *Replica) Restart() error {
	bin, err := gobuild.Binary(context.Background(), "services/atoll-cloud")
	if err != nil {
		return err
	}
	return r.start(bin)
}

// Kill sends SIGKILL: no shutdown, no Lease released, connections left
// for the peers to find dead. It returns once the process has exited.
func (r *Replica) Kill() error { return r.signal(syscall.SIGKILL, 10*time.Second) }

// Stop sends SIGTERM, then SIGKILL after grace.
func (r *Replica) Stop(grace time.Duration) error {
	if err := r.signal(syscall.SIGTERM, grace); err != nil {
		return r.signal(syscall.SIGKILL, 10*time.Second)
	}
	return nil
}

func (r *Replica) signal(sig syscall.Signal, wait time.Duration) error {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.mu.Unlock()
	if cmd == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("testbed: %s %s: %w", sig, r.Name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(wait):
		return fmt.Errorf("testbed: %s still runs %s after %s", r.Name, wait, sig)
	}
}

// Running reports whether the process runs.
func (r *Replica) Running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// WaitReady waits, within ctx and a minute, until the replica's /readyz
// passes; a replica that exits meanwhile fails with its log's tail.
func (r *Replica) WaitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		if !r.Running() {
			return fmt.Errorf("testbed: %s exited:\n%s", r.Name, r.LogTail(30))
		}
		if r.Ready(ctx) == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testbed: %s not ready: %w\n%s", r.Name, r.Ready(context.Background()), r.LogTail(30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Ready asks the replica's /readyz.
func (r *Replica) Ready(ctx context.Context) error {
	body, code, err := r.get(ctx, "/readyz?verbose")
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("readyz %d: %s", code, body)
	}
	return nil
}

// Metrics returns the replica's /metrics.
func (r *Replica) Metrics(ctx context.Context) (string, error) {
	body, code, err := r.get(ctx, "/metrics")
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("metrics: %d", code)
	}
	return body, err
}

func (r *Replica) get(ctx context.Context, path string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.AdminURL+path, nil)
	if err != nil {
		return "", 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode, err
}

// LogPath is the replica's log (every run of it, appended).
func (r *Replica) LogPath() string { return r.logPath }

// LogTail returns the last n lines of the replica's log.
func (r *Replica) LogTail(n int) string {
	b, err := os.ReadFile(r.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// writeKubeconfig writes rc (a bearer token or a client certificate, and
// the CA) as a kubeconfig file.
func writeKubeconfig(path string, rc *rest.Config) error {
	if rc == nil {
		return errors.New("testbed: no Kubernetes client configuration")
	}
	ca := rc.CAData
	if len(ca) == 0 && rc.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(rc.CAFile); err != nil {
			return err
		}
	}
	user := &clientcmdapi.AuthInfo{Token: rc.BearerToken, ClientCertificateData: rc.CertData, ClientKeyData: rc.KeyData,
		ClientCertificate: rc.CertFile, ClientKey: rc.KeyFile}
	kc := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"bed": {Server: rc.Host, CertificateAuthorityData: ca}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"atoll-cloud": user},
		Contexts:       map[string]*clientcmdapi.Context{"bed": {Cluster: "bed", AuthInfo: "atoll-cloud"}},
		CurrentContext: "bed",
	}
	return clientcmd.WriteToFile(kc, path)
}

func urlPort(raw string) (int, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(u.Port())
}

// proxy is the webhook's Service: it sends each connection to its
// backends in turn, skipping those that refuse it.
type proxy struct {
	ln net.Listener

	mu       sync.Mutex
	backends []string
	next     int
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
}

func listenProxy(addr string) (*proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("testbed: webhook service: %w", err)
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

func (p *proxy) add(backend string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backends = append(p.backends, backend)
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.forward(c) })
	}
}

func (p *proxy) forward(c net.Conn) {
	p.mu.Lock()
	backends := append([]string(nil), p.backends...)
	start := p.next
	p.next++
	p.mu.Unlock()
	var up net.Conn
	for i := range backends {
		var err error
		if up, err = net.DialTimeout("tcp", backends[(start+i)%len(backends)], time.Second); err == nil {
			break
		}
	}
	if up == nil {
		_ = c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = struct{}{}, struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, up)
		p.mu.Unlock()
		_ = c.Close()
		_ = up.Close()
	}()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

func (p *proxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
