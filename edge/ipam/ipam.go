// Package ipam is Atoll's CNI IPAM plugin (atoll-ipam): it hands a pod
// whose sandbox is created again on the same node (after a reboot, a
// runtime restart) the address it had, so that the EndpointSlices every
// node of the unit serves stay true while the cloud cannot update them.
//
// It wraps another IPAM plugin that keeps its allocations on disk
// (host-local), given as the "delegate" of its "ipam" section:
//
//	"ipam": {"type": "atoll-ipam", "dataDir": "/var/lib/cni/atoll-ipam",
//	         "delegate": {"type": "host-local", "ranges": [[{"subnet": "10.244.1.0/24"}]]}}
//
// After each ADD it records, by pod UID (the runtime's K8S_POD_UID), the
// addresses the delegate gave and the sandbox they went to, in a snapshot
// under dataDir. An ADD for a pod in the snapshot asks the delegate for
// the same addresses (its "args.cni.ips"); an address still reserved for
// the pod's previous sandbox (which a reboot ended without a DEL) is
// released first. An address another pod holds now is not taken: the
// pod gets a new one, as it would without the snapshot. DEL, CHECK, GC
// and STATUS are the delegate's; the snapshot outlives DEL (the sandbox
// may come back) and forgets an address once another pod gets it.
package ipam

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/atoll-edge/atoll/internal/atomicfile"
)

// DefaultDataDir holds the snapshots when the configuration names none.
const DefaultDataDir = "/var/lib/cni/atoll-ipam"

// netConf is what the plugin reads of the network configuration; the
// rest is passed to the delegate as it came.
type netConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	IPAM       struct {
		Type     string          `json:"type"`
		DataDir  string          `json:"dataDir"`
		Delegate json.RawMessage `json:"delegate"`
	} `json:"ipam"`
}

// delegate is what the plugin reads of the delegate's configuration.
type delegate struct {
	Type    string `json:"type"`
	DataDir string `json:"dataDir"`
}

// Snapshot is the addresses of each pod, by UID, as kept on disk.
type Snapshot struct {
	Pods map[string]Entry `json:"pods"`
}

// Entry is one pod's addresses and the sandbox they were given to.
type Entry struct {
	Pod       string   `json:"pod"` // namespace/name, for people
	IPs       []string `json:"ips"`
	Container string   `json:"container"`
	IfName    string   `json:"ifname"`
}

// Plugin runs the CNI commands; Exec runs the delegate (nil: the
// executable of its type found in CNI_PATH).
type Plugin struct {
	Exec invoke.Exec
}

// Funcs are the plugin's commands for skel.PluginMainFuncs.
func (p Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, GC: p.GC, Status: p.Status}
}

func load(stdin []byte) (netConf, delegate, []byte, error) {
	var n netConf
	if err := json.Unmarshal(stdin, &n); err != nil {
		return n, delegate{}, nil, fmt.Errorf("atoll-ipam: network configuration: %w", err)
	}
	var d delegate
	if len(n.IPAM.Delegate) == 0 || json.Unmarshal(n.IPAM.Delegate, &d) != nil || d.Type == "" {
		return n, d, nil, errors.New(`atoll-ipam: the "ipam" section needs a "delegate" with a "type" (e.g. host-local)`)
	}
	if d.Type == n.IPAM.Type {
		return n, d, nil, fmt.Errorf("atoll-ipam: the delegate cannot be %s itself", d.Type)
	}
	if n.Name == "" {
		return n, d, nil, errors.New(`atoll-ipam: the network configuration has no "name"`)
	}
	conf, err := withIPAM(stdin, n.IPAM.Delegate, nil)
	return n, d, conf, err
}

// withIPAM is the network configuration with ipam replaced by the
// delegate's and, when ips are given, the delegate asked for them.
func withIPAM(stdin, ipam json.RawMessage, ips []string) ([]byte, error) {
	var conf map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, fmt.Errorf("atoll-ipam: network configuration: %w", err)
	}
	conf["ipam"] = ipam
	if len(ips) > 0 {
		args := map[string]json.RawMessage{}
		if raw, ok := conf["args"]; ok {
			if err := json.Unmarshal(raw, &args); err != nil {
				return nil, fmt.Errorf("atoll-ipam: args: %w", err)
			}
		}
		cni := map[string]any{}
		if raw, ok := args["cni"]; ok {
			if err := json.Unmarshal(raw, &cni); err != nil {
				return nil, fmt.Errorf("atoll-ipam: args.cni: %w", err)
			}
		}
		cni["ips"] = ips
		b, _ := json.Marshal(cni)
		args["cni"] = b
		b, _ = json.Marshal(args)
		conf["args"] = b
	}
	return json.Marshal(conf)
}

// podArgs is the pod's UID and namespace/name from the runtime's
// CNI_ARGS.
func podArgs(args string) (uid, pod string) {
	var ns, name string
	for kv := range strings.SplitSeq(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_UID":
			uid = v
		case "K8S_POD_NAMESPACE":
			ns = v
		case "K8S_POD_NAME":
			name = v
		}
	}
	return uid, ns + "/" + name
}

// Add allocates through the delegate, asking for the pod's previous
// addresses when the snapshot has them, and records what it got.
func (p Plugin) Add(args *skel.CmdArgs) error {
	n, d, conf, err := load(args.StdinData)
	if err != nil {
		return err
	}
	uid, pod := podArgs(args.Args)
	if uid == "" {
		// Not a Kubernetes pod: nothing to keep.
		res, err := invoke.DelegateAdd(context.TODO(), d.Type, conf, p.Exec)
		if err != nil {
			return err
		}
		return types.PrintResult(res, n.CNIVersion)
	}
	snap, err := openSnapshot(n.IPAM.DataDir, n.Name)
	if err != nil {
		return err
	}
	defer snap.close()
	var res types.Result
	if prev, ok := snap.Pods[uid]; ok && validIPs(prev.IPs) == nil {
		if prev.Container != args.ContainerID {
			p.releaseStale(prev, d, n.Name, conf, args)
		}
		asked, err := withIPAM(args.StdinData, n.IPAM.Delegate, prev.IPs)
		if err != nil {
			return err
		}
		if res, err = invoke.DelegateAdd(context.TODO(), d.Type, asked, p.Exec); err != nil {
			fmt.Fprintf(os.Stderr, "atoll-ipam: pod %s: its previous addresses %v are taken (%v); allocating others\n", pod, prev.IPs, err)
			res = nil
		}
	}
	if res == nil {
		if res, err = invoke.DelegateAdd(context.TODO(), d.Type, conf, p.Exec); err != nil {
			return err
		}
	}
	got, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("atoll-ipam: the delegate's result: %w", err)
	}
	var ips []string
	for _, c := range got.IPs {
		ips = append(ips, c.Address.IP.String())
	}
	snap.record(uid, Entry{Pod: pod, IPs: ips, Container: args.ContainerID, IfName: args.IfName})
	if err := snap.save(); err != nil {
		// The pod has its address; only a later restore is lost.
		fmt.Fprintf(os.Stderr, "atoll-ipam: pod %s: snapshot not saved: %v\n", pod, err)
	}
	return types.PrintResult(res, n.CNIVersion)
}

// releaseStale releases the addresses the delegate still reserves for
// the pod's previous sandbox, found by its own allocation files
// (host-local's: one file per address, holding the container ID).
func (p Plugin) releaseStale(prev Entry, d delegate, network string, conf []byte, args *skel.CmdArgs) {
	dir := d.DataDir
	if dir == "" {
		dir = "/var/lib/cni/networks"
	}
	held := false
	for _, ip := range prev.IPs {
		b, err := os.ReadFile(filepath.Join(dir, network, ip))
		if err == nil {
			id, _, _ := strings.Cut(string(b), "\n")
			held = held || strings.TrimSpace(id) == prev.Container
		}
	}
	if !held {
		return
	}
	exec := p.Exec
	if exec == nil {
		exec = &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}}
	}
	path, err := exec.FindInPath(d.Type, filepath.SplitList(os.Getenv("CNI_PATH")))
	if err != nil {
		return
	}
	ifname := prev.IfName
	if ifname == "" {
		ifname = args.IfName
	}
	del := &invoke.Args{Command: "DEL", ContainerID: prev.Container, IfName: ifname, PluginArgsStr: args.Args, Path: os.Getenv("CNI_PATH")}
	if err := invoke.ExecPluginWithoutResult(context.TODO(), path, conf, del, exec); err != nil {
		fmt.Fprintf(os.Stderr, "atoll-ipam: release %v of sandbox %s: %v\n", prev.IPs, prev.Container, err)
	}
}

// Del is the delegate's; the snapshot keeps the pod's addresses.
func (p Plugin) Del(args *skel.CmdArgs) error {
	_, d, conf, err := load(args.StdinData)
	if err != nil {
		return err
	}
	return invoke.DelegateDel(context.TODO(), d.Type, conf, p.Exec)
}

// Check is the delegate's.
func (p Plugin) Check(args *skel.CmdArgs) error {
	_, d, conf, err := load(args.StdinData)
	if err != nil {
		return err
	}
	return invoke.DelegateCheck(context.TODO(), d.Type, conf, p.Exec)
}

// GC is the delegate's.
func (p Plugin) GC(args *skel.CmdArgs) error {
	_, d, conf, err := load(args.StdinData)
	if err != nil {
		return err
	}
	return invoke.DelegateGC(context.TODO(), d.Type, conf, p.Exec)
}

// Status is the delegate's.
func (p Plugin) Status(args *skel.CmdArgs) error {
	_, d, conf, err := load(args.StdinData)
	if err != nil {
		return err
	}
	return invoke.DelegateStatus(context.TODO(), d.Type, conf, p.Exec)
}

// snapshot is the network's snapshot, locked while open.
type snapshot struct {
	Snapshot
	file string
	lock *os.File
}

// openSnapshot locks and reads the snapshot of network in dir. One that
// does not read is started afresh (its pods get new addresses).
func openSnapshot(dir, network string) (*snapshot, error) {
	if dir == "" {
		dir = DefaultDataDir
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("atoll-ipam: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, network+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("atoll-ipam: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		lock.Close()
		return nil, fmt.Errorf("atoll-ipam: lock: %w", err)
	}
	s := &snapshot{file: filepath.Join(dir, network+".json"), lock: lock}
	b, err := os.ReadFile(s.file)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		fmt.Fprintf(os.Stderr, "atoll-ipam: snapshot %s: %v; starting afresh\n", s.file, err)
	default:
		if err := json.Unmarshal(b, &s.Snapshot); err != nil {
			fmt.Fprintf(os.Stderr, "atoll-ipam: snapshot %s does not read (%v); starting afresh\n", s.file, err)
			s.Snapshot = Snapshot{}
		}
	}
	if s.Pods == nil {
		s.Pods = map[string]Entry{}
	}
	return s, nil
}

// record keeps e for pod uid and forgets every other pod's claim on its
// addresses.
func (s *snapshot) record(uid string, e Entry) {
	for other, o := range s.Pods {
		if other != uid && slices.ContainsFunc(o.IPs, func(ip string) bool { return slices.Contains(e.IPs, ip) }) {
			delete(s.Pods, other)
		}
	}
	s.Pods[uid] = e
}

// save writes the snapshot durably (a power cut leaves the old one or
// the new one).
func (s *snapshot) save() error {
	b, err := json.MarshalIndent(s.Snapshot, "", " ")
	if err != nil {
		return err
	}
	return atomicfile.Write(s.file, b, 0o600)
}

func (s *snapshot) close() { s.lock.Close() }

// validIPs reports addresses that do not parse.
func validIPs(ips []string) error {
	for _, ip := range ips {
		if net.ParseIP(ip) == nil {
			return fmt.Errorf("atoll-ipam: %q is not an address", ip)
		}
	}
	return nil
}
