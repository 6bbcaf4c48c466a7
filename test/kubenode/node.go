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
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/test/poll"
)

// Node is one real node of a fleet.
type Node struct {
	// Name is the node's name (its Node object, its certificate's user
	// system:node:<Name>).
	Name string
	// IP is its address on the fleet's bridge (its InternalIP).
	IP string
	// PodCIDR is the range its pods get addresses from.
	PodCIDR string
	// Disk survives power cuts: containerd's root, the kubelet's root
	// directory, the CNI allocations, certificates, configuration, logs.
	Disk string
	// Run is lost at each boot: sockets, containerd's and runc's state.
	Run string
	// CgroupRoot is the cgroup (in every hierarchy) its pods run under.
	CgroupRoot string
	// ProxyAPIServer, when set, is the URL kube-proxy reads Services and
	// EndpointSlices from instead of the apiserver (plain HTTP, no
	// credentials: an endpoints proxy on the node); SetProxyAPIServer
	// changes it.
	ProxyAPIServer string

	fleet   *Fleet
	index   int
	netns   string
	hostEnd string
	mountNS string

	mu         sync.Mutex
	localAPI   *process
	agent      *process
	containerd *process
	kubelet    *process
	kubeProxy  *process
}

// process is a running program of the node; done is closed once it has
// exited.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// kill kills the process with SIGKILL and waits until it has exited.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// runRoot holds the run directories and mount namespaces of fleet net.
func runRoot(net int) string { return filepath.Join("/run/atoll-kubenode", strconv.Itoa(net)) }

func newNode(f *Fleet, name string, i int) *Node {
	runRoot := runRoot(f.cfg.Net)
	return &Node{
		Name:       name,
		IP:         fmt.Sprintf("10.199.%d.%d", f.cfg.Net, 10+i),
		PodCIDR:    fmt.Sprintf("10.%d.%d.0/24", 240+f.cfg.Net, i),
		Disk:       filepath.Join(f.cfg.Dir, name),
		Run:        filepath.Join(runRoot, name),
		CgroupRoot: fmt.Sprintf("atoll-kn%d-%s", f.cfg.Net, name),
		fleet:      f,
		index:      i,
		netns:      fmt.Sprintf("kn%d-%s", f.cfg.Net, name),
		hostEnd:    fmt.Sprintf("kn%dh%d", f.cfg.Net, i),
		mountNS:    filepath.Join(runRoot, "ns", name),
	}
}

// hostPaths are where a kubelet and the CNI plugins write whatever their
// configuration says; each node binds a directory of its disk over them
// in its mount namespace.
var hostPaths = []string{"/var/lib/kubelet", "/var/lib/cni", "/var/log/pods", "/var/log/containers",
	// atoll-edge's state (its DaemonSet's hostPath), and its
	// configuration as a host service (deploy/host).
	stateDir, "/etc/atoll"}

// stateDir is atoll-edge's state directory (Config.StateDiskSize).
const stateDir = "/var/lib/atoll"

// HostIP is the host's address on the node's bridge (HostIP of its
// fleet's net): where the node reaches the control plane.
func (n *Node) HostIP() string { return HostIP(n.fleet.cfg.Net) }

// HostPath is the directory of the node's disk that the node's programs
// see at p, one of the paths each node has of its own (/var/lib/kubelet,
// /var/lib/cni, /var/log/pods, /var/log/containers, /var/lib/atoll,
// /etc/atoll).
func (n *Node) HostPath(p string) string { return filepath.Join(n.Disk, "host", p) }

// create makes the node's network namespace, routes, certificates and
// configuration; others are the fleet's nodes so far.
func (n *Node) create(others []*Node) error {
	c := n.fleet.cluster
	for _, d := range []string{"logs", "pki", "kubelet", "containerd/root", "cni/ipam"} {
		if err := os.MkdirAll(filepath.Join(n.Disk, d), 0o700); err != nil {
			return err
		}
	}
	nodeCert, nodeKey, err := c.IssueClientCert("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	servingCert, servingKey, err := c.IssueServingCert(n.IP, n.Name)
	if err != nil {
		return err
	}
	proxyCert, proxyKey, err := c.IssueClientCert("system:kube-proxy")
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"ca.crt": c.CABundle(), "node.crt": nodeCert, "node.key": nodeKey,
		"kubelet.crt": servingCert, "kubelet.key": servingKey, "kube-proxy.crt": proxyCert, "kube-proxy.key": proxyKey} {
		if err := os.WriteFile(filepath.Join(n.Disk, "pki", name), data, 0o600); err != nil {
			return err
		}
	}
	if err := n.writeConfig(); err != nil {
		return err
	}
	host := HostIP(n.fleet.cfg.Net)
	// What a killed run left: its containers, shims, the processes still
	// in its namespace (a kubelet or containerd whose test was killed),
	// the namespace and its uplink (a veth outlives a namespace name
	// while a process holds the namespace).
	for _, pid := range n.shims() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	n.killContainers()
	if out, err := exec.Command("ip", "netns", "pids", n.netns).Output(); err == nil {
		for _, f := range strings.Fields(string(out)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_ = ip("netns", "del", n.netns)
	_ = ip("link", "del", n.hostEnd)
	if err := ipAll(
		[]string{"netns", "add", n.netns},
		[]string{"link", "add", n.hostEnd, "type", "veth", "peer", "name", "eth0", "netns", n.netns},
		[]string{"link", "set", n.hostEnd, "master", n.fleet.bridgeName(), "up"},
		[]string{"-n", n.netns, "addr", "add", n.IP + "/24", "dev", "eth0"},
		[]string{"-n", n.netns, "link", "set", "eth0", "up"},
		[]string{"-n", n.netns, "link", "set", "lo", "up"},
		[]string{"-n", n.netns, "route", "add", "default", "via", host},
		[]string{"route", "replace", n.PodCIDR, "via", n.IP},
	); err != nil {
		return fmt.Errorf("kubenode: %s: network: %w", n.Name, err)
	}
	if out, err := exec.Command("ip", "netns", "exec", n.netns, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		return fmt.Errorf("kubenode: %s: forwarding: %w: %s", n.Name, err, out)
	}
	if n.viaHub() {
		if err := n.hubOnly(); err != nil {
			return err
		}
	}
	for _, o := range others {
		if err := ipAll(
			[]string{"-n", n.netns, "route", "replace", o.PodCIDR, "via", o.IP},
			[]string{"-n", o.netns, "route", "replace", n.PodCIDR, "via", n.IP},
		); err != nil {
			return fmt.Errorf("kubenode: %s: routes to %s: %w", n.Name, o.Name, err)
		}
	}
	return nil
}

// Boot starts the node as a machine boots: a fresh mount namespace and
// run directory on the same disk, then containerd, then the kubelet once
// containerd answers. It returns once both run; WaitReady waits for the
// Node.
func (n *Node) Boot(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil || n.containerd != nil || n.kubeProxy != nil || n.localAPI != nil || n.agent != nil {
		return fmt.Errorf("kubenode: %s is running", n.Name)
	}
	n.dropMounts()
	if err := os.RemoveAll(n.Run); err != nil {
		return err
	}
	if err := os.MkdirAll(n.Run, 0o700); err != nil {
		return err
	}
	if err := n.mountNamespace(); err != nil {
		return err
	}
	if err := n.cgroups(); err != nil {
		return err
	}
	if hostAgent := n.fleet.cfg.HostAgent; hostAgent != nil {
		args, env, err := hostAgent(n)
		if err != nil {
			return fmt.Errorf("kubenode: %s: host agent: %w", n.Name, err)
		}
		if args != nil {
			if n.agent, err = n.startEnv("atoll-edge", env, filepath.Join(n.fleet.atollBin, "atoll-edge"), args...); err != nil {
				return err
			}
		}
	}
	if err := n.startLocalAPI(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	args := []string{"--config=" + filepath.Join(n.Disk, "kubelet-config.yaml"),
		"--kubeconfig=" + filepath.Join(n.Disk, "kubelet.kubeconfig"),
		"--root-dir=" + filepath.Join(n.Disk, "kubelet"),
		"--cert-dir=" + filepath.Join(n.Disk, "kubelet", "pki"),
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		"--v=2"}
	if labels := n.fleet.cfg.Labels; labels != nil {
		var kv []string
		for k, v := range labels(n.Name) {
			kv = append(kv, k+"="+v)
		}
		if len(kv) > 0 {
			slices.Sort(kv)
			args = append(args, "--node-labels="+strings.Join(kv, ","))
		}
	}
	var err error
	if n.kubelet, err = n.start("kubelet", filepath.Join(n.fleet.cfg.BinDir, "kubelet"), args...); err != nil {
		return err
	}
	return n.startKubeProxy()
}

// viaHub reports whether the node reaches kube-apiserver only through
// its host agent (Config.LocalAPIViaHub).
func (n *Node) viaHub() bool {
	return n.fleet.cfg.LocalAPIViaHub != nil && n.fleet.cfg.LocalAPIViaHub(n.Name)
}

// exited names the first of the node's programs that has exited since
// its boot, with its last log lines, or is nil.
func (n *Node) exited() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range []struct {
		name string
		proc *process
	}{{"containerd", n.containerd}, {"kubelet", n.kubelet}, {"local-api", n.localAPI}, {"atoll-edge", n.agent}} {
		if p.proc == nil {
			continue
		}
		select {
		case <-p.proc.done:
			return fmt.Errorf("kubenode: %s: %s exited (%v)\n%s", n.Name, p.name, p.proc.cmd.ProcessState, n.logTail(p.name, 30))
		default:
		}
	}
	return nil
}

// startLocalAPI runs the node's local API endpoint with the node's
// credentials, its cache under /var/lib/atoll (the node's disk), when the
// fleet has one.
func (n *Node) startLocalAPI() error {
	if !n.fleet.cfg.LocalAPI {
		return nil
	}
	pki := filepath.Join(n.Disk, "pki")
	args := []string{"local-api",
		"--listen=" + LocalAPIAddr, "--admin-addr=" + LocalAPIAdminAddr,
		"--apiserver=" + n.fleet.apiServer, "--ca-file=" + filepath.Join(pki, "ca.crt"),
		"--client-cert=" + filepath.Join(pki, "node.crt"), "--client-key=" + filepath.Join(pki, "node.key"),
		"--dir=/var/lib/atoll/local-api", "--log-format=text"}
	if n.viaHub() {
		args = append(args, "--apiserver-via=hub", "--hub-forward="+HubForwardAddr)
	}
	var err error
	n.localAPI, err = n.start("local-api", filepath.Join(n.fleet.atollBin, "atoll-edge"), args...)
	return err
}

// startContainerd runs containerd and waits until it answers.
func (n *Node) startContainerd(ctx context.Context) error {
	var err error
	if n.containerd, err = n.start("containerd", filepath.Join(n.fleet.cfg.BinDir, "containerd"),
		"--config", filepath.Join(n.Disk, "containerd", "config.toml")); err != nil {
		return err
	}
	sock := filepath.Join(n.Run, "containerd.sock")
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := poll.Until(wait, func(context.Context) error {
		c, err := net.Dial("unix", sock)
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		return fmt.Errorf("kubenode: %s: containerd does not answer on %s: %w\n%s", n.Name, sock, err, n.logTail("containerd", 20))
	}
	return nil
}

// StopContainerd kills the node's containerd alone (SIGKILL), as a
// crashed runtime: the shims and the containers keep running, the
// kubelet finds the runtime gone. StartContainerd starts it again.
func (n *Node) StopContainerd() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.containerd != nil {
		n.containerd.kill()
		n.containerd = nil
	}
}

// StartContainerd starts the node's containerd after StopContainerd.
func (n *Node) StartContainerd(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.containerd != nil {
		return fmt.Errorf("kubenode: %s: containerd is running", n.Name)
	}
	return n.startContainerd(ctx)
}

// startKubeProxy runs kube-proxy with the node's configuration.
func (n *Node) startKubeProxy() error {
	var err error
	n.kubeProxy, err = n.start("kube-proxy", filepath.Join(n.fleet.cfg.BinDir, "kube-proxy"),
		"--config="+filepath.Join(n.Disk, "kube-proxy.yaml"), "--v=2")
	return err
}

// SetProxyAPIServer points the node's kube-proxy at url (empty: the
// apiserver) and restarts it; its rules stay in place meanwhile.
func (n *Node) SetProxyAPIServer(url string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ProxyAPIServer = url
	if err := n.writeConfig(); err != nil {
		return err
	}
	if n.kubeProxy == nil {
		return nil
	}
	n.kubeProxy.kill()
	return n.startKubeProxy()
}

// cutTable is the nftables table of the node's network namespace that
// Cut fills and Heal removes.
const cutTable = "kubenode-cut"

// Cut drops, silently, every packet between the node (its own programs
// and its pods) and addrs (addresses or CIDRs), as a link that dies
// behind a NAT does: no reset, no ICMP. Heal undoes it.
func (n *Node) Cut(addrs ...string) error {
	if len(addrs) == 0 {
		return errors.New("kubenode: cut: no address")
	}
	set := "{ " + strings.Join(addrs, ", ") + " }"
	rules := fmt.Sprintf(`table inet %[1]s {
	chain cut_out { type filter hook output priority -200; ip daddr %[2]s drop; }
	chain cut_in { type filter hook input priority -200; ip saddr %[2]s drop; }
	chain cut_fwd { type filter hook forward priority -200; ip daddr %[2]s drop; ip saddr %[2]s drop; }
}
`, cutTable, set)
	_ = n.Heal()
	cmd := exec.Command("ip", "netns", "exec", n.netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubenode: %s: cut: %w: %s", n.Name, err, out)
	}
	return nil
}

// hubOnly drops what the node's own programs send to kube-apiserver
// (not its pods': they are forwarded, and reach it through the
// kubernetes Service), and points kube-proxy at the local API endpoint.
func (n *Node) hubOnly() error {
	u, err := url.Parse(n.fleet.apiServer)
	if err != nil {
		return err
	}
	rules := fmt.Sprintf(`table inet kubenode-hub-only {
	chain out { type filter hook output priority -200; ip daddr %s tcp dport %s drop; }
}
`, u.Hostname(), u.Port())
	cmd := exec.Command("ip", "netns", "exec", n.netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubenode: %s: no direct way to kube-apiserver: %w: %s", n.Name, err, out)
	}
	if n.ProxyAPIServer == "" {
		n.ProxyAPIServer = "http://" + LocalAPIAddr
		return n.writeConfig()
	}
	return nil
}

// Exec runs a program in the node's network namespace (as a program of
// the host: curl, nft) and returns its combined output.
func (n *Node) Exec(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.netns}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubenode: %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Heal ends a Cut.
func (n *Node) Heal() error {
	out, err := exec.Command("ip", "netns", "exec", n.netns, "nft", "delete", "table", "inet", cutTable).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "No such file") {
		return fmt.Errorf("kubenode: %s: heal: %w: %s", n.Name, err, out)
	}
	return nil
}

const degradeTable = "kubenode-degrade"

// Degrade makes the node's link poor, both ways and for every peer: a
// share of lossPercent of the packets through its uplink (eth0) dropped
// at random — what stays inside the node, such as the kubelet's probes
// of its pods, is not touched — and its uplink's sending rate limited to
// rate (a tc rate such as "2mbit"; empty: no
// limit), whose queue delays what exceeds it. This kernel has no netem,
// so a fixed delay is not available. Restore undoes it.
func (n *Node) Degrade(lossPercent int, rate string) error {
	if lossPercent < 0 || lossPercent > 100 {
		return fmt.Errorf("kubenode: %s: degrade: loss %d %%: want 0 to 100", n.Name, lossPercent)
	}
	n.Restore()
	if lossPercent > 0 {
		drop := fmt.Sprintf("numgen random mod 100 < %d drop", lossPercent)
		if lossPercent == 100 {
			drop = "drop"
		}
		rules := fmt.Sprintf(`table inet %[1]s {
	chain loss_out { type filter hook output priority -190; oifname "eth0" %[2]s; }
	chain loss_in { type filter hook input priority -190; iifname "eth0" %[2]s; }
	chain loss_fwd { type filter hook forward priority -190; iifname "eth0" %[2]s; oifname "eth0" %[2]s; }
}
`, degradeTable, drop)
		cmd := exec.Command("ip", "netns", "exec", n.netns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubenode: %s: degrade: %w: %s", n.Name, err, out)
		}
	}
	if rate != "" {
		if out, err := exec.Command("ip", "netns", "exec", n.netns, "tc", "qdisc", "replace", "dev", "eth0", "root",
			"tbf", "rate", rate, "burst", "32kbit", "latency", "400ms").CombinedOutput(); err != nil {
			return fmt.Errorf("kubenode: %s: degrade: %w: %s", n.Name, err, out)
		}
	}
	return nil
}

// Restore ends a Degrade.
func (n *Node) Restore() {
	_ = exec.Command("ip", "netns", "exec", n.netns, "nft", "delete", "table", "inet", degradeTable).Run()
	_ = exec.Command("ip", "netns", "exec", n.netns, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
}

// start runs bin in the node's network and mount namespaces, its output
// appended to logs/<name>.log.
func (n *Node) start(name, bin string, args ...string) (*process, error) {
	return n.startEnv(name, nil, bin, args...)
}

// startEnv is start with env (NAME=value) added to the environment.
func (n *Node) startEnv(name string, env []string, bin string, args ...string) (*process, error) {
	log, err := os.OpenFile(filepath.Join(n.Disk, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "### %s boot\n", time.Now().UTC().Format(time.RFC3339Nano))
	// nsenter joins the namespaces and execs bin in the same process:
	// its pid is bin's.
	cmd := exec.Command("nsenter", append([]string{"--mount=" + n.mountNS, "--net=/run/netns/" + n.netns, "--", bin}, args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("kubenode: %s: start %s: %w", n.Name, name, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	return p, nil
}

// mountNamespace makes the node's mount namespace: the host's mounts
// propagate into it, none of its own leak out, and its disk's
// directories cover hostPaths.
func (n *Node) mountNamespace() error {
	nsDir := filepath.Dir(n.mountNS)
	if err := os.MkdirAll(nsDir, 0o700); err != nil {
		return err
	}
	// A namespace is kept by binding it to a file, which needs a parent
	// mount of private propagation.
	if !isMountPoint(nsDir) {
		if out, err := exec.Command("sh", "-c", "mount --bind "+nsDir+" "+nsDir+" && mount --make-private "+nsDir).CombinedOutput(); err != nil {
			return fmt.Errorf("kubenode: private mount %s: %w: %s", nsDir, err, out)
		}
	}
	if err := os.WriteFile(n.mountNS, nil, 0o600); err != nil {
		return err
	}
	var script strings.Builder
	for _, p := range hostPaths {
		own := n.HostPath(p)
		if err := os.MkdirAll(own, 0o700); err != nil {
			return err
		}
		if size := n.fleet.cfg.StateDiskSize; p == stateDir && size != "" && !isMountPoint(own) {
			if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size+",mode=0700", "atoll-state", own).CombinedOutput(); err != nil {
				return fmt.Errorf("kubenode: %s: state disk: %w: %s", n.Name, err, out)
			}
		}
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		fmt.Fprintf(&script, "mount --bind %s %s && ", own, p)
	}
	script.WriteString("true")
	if out, err := exec.Command("unshare", "--mount="+n.mountNS, "--propagation", "slave", "sh", "-c", script.String()).CombinedOutput(); err != nil {
		return fmt.Errorf("kubenode: %s: mount namespace: %w: %s", n.Name, err, out)
	}
	return nil
}

// dropMounts releases the node's mount namespace: every mount made in it
// (pods' root filesystems and volumes, their network namespaces' files)
// goes with it, as at a reboot.
func (n *Node) dropMounts() {
	if isMountPoint(n.mountNS) {
		_ = exec.Command("umount", n.mountNS).Run()
	}
	_ = os.Remove(n.mountNS)
}

func isMountPoint(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// cgroupHierarchies are the cgroup directories the node's root goes in:
// the unified one on cgroup v2, every v1 hierarchy on v1.
func cgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*")
	var out []string
	for _, d := range dirs {
		if filepath.Base(d) == "unified" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// cgroups creates the node's cgroup root in every hierarchy (the
// kubelet's cgroupfs driver expects it), with the host's cpus and
// memory nodes where cpuset needs them.
func (n *Node) cgroups() error {
	for _, h := range cgroupHierarchies() {
		dir := filepath.Join(h, n.CgroupRoot)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("kubenode: %s: cgroup %s: %w", n.Name, dir, err)
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				v, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), v, 0o644); err != nil {
					return fmt.Errorf("kubenode: %s: %s: %w", n.Name, f, err)
				}
			}
		}
	}
	return nil
}

// PowerCut kills the node at once: kubelet, containerd, every shim and
// every process in the node's cgroups (its containers), with SIGKILL,
// and returns once the kubelet and containerd are gone. Its disk stays
// as it was; Boot starts it again.
func (n *Node) PowerCut() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, p := range []*process{n.kubelet, n.containerd, n.kubeProxy, n.localAPI, n.agent} {
		if p != nil {
			p.kill()
		}
	}
	n.kubelet, n.containerd, n.kubeProxy, n.localAPI, n.agent = nil, nil, nil, nil, nil
	for _, pid := range n.shims() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	n.killContainers()
	n.dropLinks()
}

// killContainers kills every process in the node's cgroups until none is
// left (a process may fork meanwhile). A cgroup left frozen is thawed
// first: runc freezes a container's cgroup while it signals every
// process of it, and a shim killed at that moment leaves it frozen, its
// processes deaf to SIGKILL for good.
func (n *Node) killContainers() {
	for range 50 {
		n.thaw()
		pids := n.cgroupPids()
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// thaw thaws every frozen cgroup under the node's root.
func (n *Node) thaw() {
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, n.CgroupRoot), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil //nolint:nilerr // a cgroup removed while walking
			}
			switch d.Name() {
			case "freezer.state": // v1
				if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != "THAWED" {
					_ = os.WriteFile(path, []byte("THAWED"), 0o644)
				}
			case "cgroup.freeze": // v2
				if b, _ := os.ReadFile(path); strings.TrimSpace(string(b)) != "0" {
					_ = os.WriteFile(path, []byte("0"), 0o644)
				}
			}
			return nil
		})
	}
}

// InFleet reports whether process pid runs in a cgroup of a node of
// fleet net: what a test uses to find a container's process among the
// machine's without touching another test's.
func InFleet(pid, net int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return err == nil && strings.Contains(string(b), fmt.Sprintf(":/atoll-kn%d-", net))
}

// dropLinks removes what a reboot takes from the node's network: every
// interface but its uplink (the pods' bridge and veths) and the
// neighbour cache. A pod's network namespace can outlive its processes
// here (the kernel holds it while a closed connection's FIN is still
// retransmitted), and with it an interface with the pod's address.
func (n *Node) dropLinks() {
	out, err := exec.Command("ip", "-n", n.netns, "-o", "link", "show").Output()
	if err != nil {
		return
	}
	for line := range strings.SplitSeq(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		if name != "lo" && name != "eth0" {
			_ = ip("-n", n.netns, "link", "del", name)
		}
	}
	_ = ip("-n", n.netns, "neigh", "flush", "all")
}

// shims are the pids of the runc shims serving this node's containerd.
func (n *Node) shims() []int {
	want := "-address\x00" + filepath.Join(n.Run, "containerd.sock") + "\x00"
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !strings.Contains(string(b)+"\x00", want) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// Processes are the pids of the node's container processes named comm
// (as /proc/<pid>/comm says), in no order.
func (n *Node) Processes(comm string) []int {
	var out []int
	for _, pid := range n.cgroupPids() {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(b)) == comm {
			out = append(out, pid)
		}
	}
	return out
}

// cgroupPids lists every process under the node's cgroup root.
func (n *Node) cgroupPids() []int {
	seen := map[int]bool{}
	for _, h := range cgroupHierarchies() {
		_ = filepath.WalkDir(filepath.Join(h, n.CgroupRoot), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil //nolint:nilerr // a cgroup removed while walking
			}
			b, _ := os.ReadFile(path)
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	out := make([]int, 0, len(seen))
	for pid := range seen {
		out = append(out, pid)
	}
	return out
}

// remove powers the node off for good: its namespaces, cgroups and
// routes go; its disk stays. It fails when a process of the node
// survives.
func (n *Node) remove() error {
	n.PowerCut()
	var err error
	if pids := append(n.cgroupPids(), n.shims()...); len(pids) > 0 {
		err = fmt.Errorf("kubenode: %s: processes %v survive its power cut", n.Name, pids)
	}
	n.dropMounts()
	if state := n.HostPath(stateDir); isMountPoint(state) {
		_ = exec.Command("umount", "-l", state).Run()
	}
	_ = os.RemoveAll(n.Run)
	// On a hybrid v1 layout the runtime also makes the containers'
	// cgroups in the unified hierarchy.
	for _, h := range append(cgroupHierarchies(), "/sys/fs/cgroup/unified") {
		removeCgroupTree(filepath.Join(h, n.CgroupRoot))
	}
	_ = ip("route", "del", n.PodCIDR)
	_ = ip("netns", "del", n.netns)
	_ = ip("link", "del", n.hostEnd)
	return err
}

// removeCgroupTree removes a cgroup and its children, deepest first.
func removeCgroupTree(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		for range 20 {
			if err := os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(50 * time.Millisecond) // its last process is still exiting
		}
	}
}

// LogTails returns the last n lines of the node's containerd and kubelet
// logs, and its local API endpoint's and host agent's.
func (n *Node) LogTails(lines int) string {
	return n.logTail("containerd", lines) + n.logTail("kubelet", lines) + n.logTail("local-api", lines) + n.logTail("atoll-edge", lines)
}

func (n *Node) logTail(name string, lines int) string {
	b, err := os.ReadFile(filepath.Join(n.Disk, "logs", name+".log"))
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return fmt.Sprintf("--- %s: last lines of %s ---\n%s\n", n.Name, name, strings.Join(all[max(0, len(all)-lines):], "\n"))
}

// ExecInPod runs args in a container of pod podUID on the node (the first
// process of the pod that is not its sandbox's pause), in that
// container's mount, network, UTS and IPC namespaces and root, as
// `kubectl exec` would, but without the apiserver: it works while the
// node is cut off. It returns the combined output.
func (n *Node) ExecInPod(ctx context.Context, podUID string, args ...string) (string, error) {
	pid := n.podProcess(podUID)
	if pid == 0 {
		return "", fmt.Errorf("kubenode: %s: no running container of pod %s", n.Name, podUID)
	}
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(pid),
		"--mount", "--net", "--uts", "--ipc", "--root", "--wd", "--"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubenode: %s: in pod %s: %s: %w: %s", n.Name, podUID, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// PodRunning reports whether a container of pod podUID runs on the node
// (a process of the pod other than its sandbox's pause).
func (n *Node) PodRunning(podUID string) bool { return n.podProcess(podUID) != 0 }

// podProcess is the pid of a process of a container of pod podUID, or 0.
func (n *Node) podProcess(podUID string) int {
	pid := 0
	hierarchies := cgroupHierarchies()
	if len(hierarchies) == 0 {
		return 0
	}
	_ = filepath.WalkDir(filepath.Join(hierarchies[0], n.CgroupRoot), func(path string, d os.DirEntry, err error) error {
		if err != nil || pid != 0 || d.IsDir() || d.Name() != "cgroup.procs" || !strings.Contains(path, "pod"+podUID) {
			return nil //nolint:nilerr // a cgroup removed while walking
		}
		b, _ := os.ReadFile(path)
		for f := range strings.FieldsSeq(string(b)) {
			p, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
			if argv0, _, _ := strings.Cut(string(cmd), "\x00"); argv0 != "" && filepath.Base(argv0) != "pause" {
				pid = p
				return filepath.SkipAll
			}
		}
		return nil
	})
	return pid
}
