package kubenode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// Config describes a fleet.
type Config struct {
	// Net separates fleets that run at once: bridge kn<Net>, hosts
	// 10.199.<Net>.0/24, pods 10.<240+Net>.<i>.0/24. 1 to 15.
	Net int
	// Dir holds the nodes' disks and logs.
	Dir string
	// BinDir holds kubelet, containerd, containerd-shim-runc-v2 and
	// cni/ (and coredns with DNS). Empty: the cluster's.
	BinDir string
	// DNS runs the cluster DNS (CoreDNS, see DNSIP) and points every
	// node's pods at it.
	DNS bool
	// LocalAPI runs Atoll's local API endpoint on every node (`atoll-edge
	// local-api`, built by Start, started before the kubelet as a systemd
	// unit would be) and points the node's kubelet at it
	// (LocalAPIAddr): the kubelet reaches kube-apiserver only through it.
	LocalAPI bool
	// KeepPodIPs makes Atoll's CNI IPAM plugin (atoll-ipam, built by
	// Start, over host-local) the nodes' IPAM: a pod whose sandbox is
	// created again after a power cut keeps its address.
	KeepPodIPs bool
	// NodeDNS, when set, names the nodes whose kubelet gives pods the
	// node's own address as their nameserver (a DNS server on the node
	// listens there, deploy/components/node-dns) instead of the cluster
	// DNS Service.
	NodeDNS func(node string) bool
	// HostAgent, when set, runs on each node for which it returns
	// arguments an atoll-edge agent (built by Start) with them and env
	// (NAME=value) added to its environment, as a host service: started
	// at boot before the local API endpoint, killed by a power cut. Its
	// log is the node's "atoll-edge". An error fails the boot.
	HostAgent func(n *Node) (args, env []string, err error)
	// LocalAPIViaHub, when set, names the nodes whose local API endpoint
	// reaches kube-apiserver through their HostAgent's forward
	// (HubForwardAddr: `--apiserver-via=hub`); whatever such a node's own
	// programs send to kube-apiserver directly is dropped: the hub is
	// their only way to it. Their kube-proxy reads the local API endpoint
	// (as the node; grant it system:node-proxier) until
	// SetProxyAPIServer points it elsewhere.
	LocalAPIViaHub func(node string) bool
	// Labels, when set, are the labels each node's kubelet registers its
	// Node with (--node-labels).
	Labels func(node string) map[string]string
	// StateDiskSize, when set (a tmpfs size: "64m"), gives each node's
	// /var/lib/atoll a filesystem of its own of that size, as a small
	// state partition: a tmpfs mounted on the host over the node's
	// HostPath, so it outlives power cuts as a disk does (it goes when
	// the fleet stops). FillDisk fills it.
	StateDiskSize string
}

// LocalAPIAddr is where a node's local API endpoint listens (on the
// node's own loopback) with Config.LocalAPI; its metrics are at
// LocalAPIAdminAddr.
const (
	LocalAPIAddr      = "127.0.0.1:10261"
	LocalAPIAdminAddr = "127.0.0.1:10262"
	// HubForwardAddr is the host agent's --tunnel-apiserver-listen with
	// Config.LocalAPIViaHub.
	HubForwardAddr = "127.0.0.1:10263"
)

// Fleet is a set of real nodes on one host bridge.
type Fleet struct {
	cfg       Config
	cluster   *kubetest.Cluster
	runc      string
	apiServer string
	registry  string
	images    *imageRegistry
	atollBin  string // atoll-edge, and cni/atoll-ipam, as the Config asks

	mu    sync.Mutex
	nodes []*Node
}

// HostIP is the host's address on the fleet's bridge: what the nodes
// reach the apiserver and the registry at.
func HostIP(net int) string { return fmt.Sprintf("10.199.%d.1", net) }

// ClusterCIDR is the range of every pod address of fleet net.
func ClusterCIDR(net int) string { return fmt.Sprintf("10.%d.0.0/16", 240+net) }

// ClusterOptions are what a kubetest control plane needs to serve a
// fleet on net: the apiserver on every address (the nodes reach it on
// the bridge), HostIP in its certificate, the Node authorizer's
// companion admission plugin NodeRestriction, kubelets reached at their
// InternalIP, KCM (the default ServiceAccount and the CA ConfigMap every
// pod mounts, node lifecycle) and the scheduler. The apiserver advertises
// HostIP, so pods reach it at the kubernetes Service through kube-proxy,
// and calls webhooks at their Services' endpoints (the host routes to
// every pod; it runs no kube-proxy).
func ClusterOptions(net int) []kubetest.Option {
	return []kubetest.Option{
		kubetest.WithControllerManager(),
		kubetest.WithScheduler(),
		func(c *kubetest.Config) {
			c.APIServerBindAddress = "0.0.0.0"
			c.APIServerSANs = append(c.APIServerSANs, HostIP(net))
		},
		kubetest.WithAPIServerFlags("--enable-admission-plugins=NodeRestriction",
			"--advertise-address="+HostIP(net),
			"--enable-aggregator-routing=true",
			// Logs, exec and port forwards reach a kubelet at its
			// InternalIP: the nodes' names resolve nowhere.
			"--kubelet-preferred-address-types=InternalIP"),
	}
}

// Prerequisites reports what this machine lacks to run real nodes, or
// nil.
func Prerequisites() error {
	if os.Geteuid() != 0 {
		return errors.New("kubenode needs root (network and mount namespaces, cgroups)")
	}
	for _, tool := range []string{"ip", "nsenter", "unshare", "mount", "umount", "runc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("kubenode needs %s (go tool task os:deps)", tool)
		}
	}
	return nil
}

// inotifyInstances is the least fs.inotify.max_user_instances real nodes
// need: each kubelet and containerd holds several, and with the fleets
// of several tests at once the default 128 runs out (the kubelet stops
// with "error creating fsnotify watcher: too many open files",
// containerd starts without its CRI plugin).
const inotifyInstances = 1024

// raiseInotifyInstances raises fs.inotify.max_user_instances to
// inotifyInstances when it is lower.
func raiseInotifyInstances() error {
	const path = "/proc/sys/fs/inotify/max_user_instances"
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("kubenode: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("kubenode: %s: %w", path, err)
	}
	if n >= inotifyInstances {
		return nil
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(inotifyInstances)), 0o644); err != nil {
		return fmt.Errorf("kubenode: raise %s from %d to %d, as real nodes need: %w", path, n, inotifyInstances, err)
	}
	return nil
}

// Start makes the fleet's bridge and image registry for cluster, which
// must run with ClusterOptions(cfg.Net). Nodes are added with Add.
func Start(ctx context.Context, cluster *kubetest.Cluster, cfg Config) (*Fleet, error) {
	if err := Prerequisites(); err != nil {
		return nil, err
	}
	if cfg.Net < 1 || cfg.Net > 15 {
		return nil, fmt.Errorf("kubenode: net %d is outside 1..15", cfg.Net)
	}
	if cfg.BinDir == "" {
		cfg.BinDir = cluster.BinDir()
	}
	for _, b := range []string{"kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "cni/bridge", "cni/host-local", "cni/loopback", "cni/portmap"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("kubenode: %s not built (go tool task kube:build node:build): %w", b, err)
		}
	}
	if err := raiseInotifyInstances(); err != nil {
		return nil, err
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(cluster.APIServerURL())
	if err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg, cluster: cluster, runc: runc,
		apiServer: "https://" + net.JoinHostPort(HostIP(cfg.Net), u.Port())}
	if err := f.bridgeUp(); err != nil {
		return nil, err
	}
	if f.images, err = serveRegistry(HostIP(cfg.Net)); err != nil {
		f.bridgeDown()
		return nil, err
	}
	f.registry = f.images.addr
	if err := f.images.pushBuiltins(ctx); err != nil {
		_ = f.Stop()
		return nil, err
	}
	if cfg.DNS {
		if err := f.startDNS(ctx); err != nil {
			_ = f.Stop()
			return nil, err
		}
	}
	if err := f.buildAtoll(ctx); err != nil {
		_ = f.Stop()
		return nil, err
	}
	return f, nil
}

// buildAtoll builds the Atoll programs the nodes run into the fleet's
// directory: atoll-edge for LocalAPI, cni/atoll-ipam for KeepPodIPs.
func (f *Fleet) buildAtoll(ctx context.Context) error {
	f.atollBin = filepath.Join(f.cfg.Dir, "bin")
	builds := map[string]bool{"atoll-edge": f.cfg.LocalAPI || f.cfg.HostAgent != nil, "atoll-ipam": f.cfg.KeepPodIPs}
	for prog, want := range builds {
		if !want {
			continue
		}
		out := filepath.Join(f.atollBin, prog)
		if prog == "atoll-ipam" {
			out = filepath.Join(f.atollBin, "cni", prog)
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/atoll-edge/atoll/services/"+prog)
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubenode: build %s: %w\n%s", prog, err, b)
		}
	}
	return nil
}

// StartForTest is Start for a test (cfg.Dir empty: a directory of the
// test's): it skips the test when the machine cannot run real nodes,
// fails it on any other error, and stops the fleet with the test.
func StartForTest(t testing.TB, cluster *kubetest.Cluster, cfg Config) *Fleet {
	t.Helper()
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	f, err := Start(t.Context(), cluster, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range f.Nodes() {
				t.Logf("%s", n.LogTails(30))
			}
		}
		if err := f.Stop(); err != nil {
			t.Error(err)
		}
	})
	return f
}

// StartWithNode starts, for test t, a control plane for fleet cfg.Net
// (ClusterOptions, then opts), the fleet, and one node named name, Ready.
// It skips t where real nodes cannot run.
func StartWithNode(t testing.TB, cfg Config, name string, opts ...kubetest.Option) (*kubetest.Cluster, *Fleet, *Node) {
	t.Helper()
	if err := Prerequisites(); err != nil {
		t.Skip(err)
	}
	cluster := kubetest.Start(t, append(ClusterOptions(cfg.Net), opts...)...)
	fleet := StartForTest(t, cluster, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	node, err := fleet.Add(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return cluster, fleet, node
}

// GrantKubeletHealthz lets user get nodes/healthz and nothing else: the
// least a kubelet's /healthz needs.
func GrantKubeletHealthz(ctx context.Context, client kubernetes.Interface, user string) error {
	name := "kubelet-healthz-" + strings.NewReplacer(":", "-").Replace(user)
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/healthz"}, Verbs: []string{"get"}}}}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	_, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{})
	return err
}

// Registry is the host:port of the fleet's image registry.
func (f *Fleet) Registry() string { return f.registry }

// SandboxImage is the pause image every node pins.
func (f *Fleet) SandboxImage() string { return f.registry + "/pause:" + builtinTag }

// Image is the reference of an image pushed to the fleet's registry.
func (f *Fleet) Image(name string) string { return f.registry + "/" + name + ":" + builtinTag }

// Nodes returns the fleet's nodes in the order they were added.
func (f *Fleet) Nodes() []*Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Node(nil), f.nodes...)
}

// Exited names a program of a running node of the fleet that has
// exited since the node's boot (a power cut is not an exit), with its
// last log lines, or is nil: a wait for the fleet can end at once.
func (f *Fleet) Exited() error {
	for _, n := range f.Nodes() {
		if err := n.exited(); err != nil {
			return err
		}
	}
	return nil
}

// Add creates node name, starts it and waits until its Node is Ready.
func (f *Fleet) Add(ctx context.Context, name string) (*Node, error) {
	f.mu.Lock()
	i := len(f.nodes) + 1
	if i > 200 {
		f.mu.Unlock()
		return nil, errors.New("kubenode: at most 200 nodes per fleet")
	}
	n := newNode(f, name, i)
	f.nodes = append(f.nodes, n)
	others := append([]*Node(nil), f.nodes[:i-1]...)
	f.mu.Unlock()
	if err := n.create(others); err != nil {
		return n, err
	}
	if err := n.Boot(ctx); err != nil {
		return n, err
	}
	return n, n.WaitReady(ctx)
}

// Stop powers every node off, removes their namespaces, cgroups and
// routes, the bridge and the registry. The disks stay in Dir. It fails
// when a process of a node survives its power cut.
func (f *Fleet) Stop() error {
	var errs []error
	for _, n := range f.Nodes() {
		errs = append(errs, n.remove())
	}
	if f.images != nil {
		f.images.close()
	}
	f.bridgeDown()
	run := runRoot(f.cfg.Net)
	if ns := filepath.Join(run, "ns"); isMountPoint(ns) {
		_ = exec.Command("umount", ns).Run()
	}
	_ = os.RemoveAll(run)
	return errors.Join(errs...)
}

func (f *Fleet) bridgeName() string { return fmt.Sprintf("kn%d", f.cfg.Net) }

func (f *Fleet) bridgeUp() error {
	br := f.bridgeName()
	_ = ip("link", "del", br) // left by a killed run
	return ipAll(
		[]string{"link", "add", br, "type", "bridge"},
		[]string{"addr", "add", HostIP(f.cfg.Net) + "/24", "dev", br},
		[]string{"link", "set", br, "up"},
	)
}

func (f *Fleet) bridgeDown() { _ = ip("link", "del", f.bridgeName()) }

// WaitReady waits until the node's Node is Ready. It fails at once when
// a program of the node (containerd, the kubelet, the local API
// endpoint, the host agent) has exited meanwhile, with its last log
// lines.
func (n *Node) WaitReady(ctx context.Context) error {
	return poll.Until(ctx, func(ctx context.Context) error {
		if err := n.exited(); err != nil {
			return poll.Permanent(err)
		}
		node, err := n.fleet.cluster.Client().CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("node %s not Ready yet", n.Name)
	})
}

// ip runs ip(8) with args.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ipAll(cmds ...[]string) error {
	for _, c := range cmds {
		if err := ip(c...); err != nil {
			return err
		}
	}
	return nil
}
