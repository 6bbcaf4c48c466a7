package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Usage is what the processes of one component hold, summed.
type Usage struct {
	Procs   int     `json:"procs"`
	RSSMiB  float64 `json:"rssMiB"`
	FDs     int     `json:"fds"`
	Threads int     `json:"threads"`
	// MaxRSSMiB is the largest process's.
	MaxRSSMiB float64 `json:"maxRssMiB"`
}

// ProcUsage is one process's.
type ProcUsage struct {
	Comm   string  `json:"comm"`
	PID    int     `json:"pid"`
	RSSMiB float64 `json:"rssMiB"`
	FDs    int     `json:"fds"`
	// Conns are the descriptors that are established TCP connections.
	Conns int `json:"conns"`
	// CPU is the CPU time it has used (user and system), in seconds.
	CPU float64 `json:"cpuSeconds"`
}

// components are the programs of Atoll whose resources are followed.
var components = []string{"atoll-cloud", "atoll-edge", "nats-server"}

// usage reads /proc for every process of the fleet net named as a
// component: the sums by component, and each process.
func usage(net int) (map[string]Usage, []ProcUsage) {
	out := map[string]Usage{}
	var procsOut []ProcUsage
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, c := range procs {
		b, err := os.ReadFile(c)
		if err != nil {
			continue
		}
		comm := strings.TrimSpace(string(b))
		known := false
		for _, k := range components {
			known = known || comm == k
		}
		if !known {
			continue
		}
		dir := filepath.Dir(c)
		pid, err := strconv.Atoi(filepath.Base(dir))
		if err != nil || !kubenode.InFleet(pid, net) {
			continue
		}
		u := out[comm]
		rss, threads := procStatus(dir)
		fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
		conns := connections(dir, fds)
		u.Procs++
		u.RSSMiB += rss
		u.MaxRSSMiB = max(u.MaxRSSMiB, rss)
		u.FDs += len(fds)
		u.Threads += threads
		out[comm] = u
		procsOut = append(procsOut, ProcUsage{Comm: comm, PID: pid, RSSMiB: rss, FDs: len(fds), Conns: conns, CPU: procCPU(dir)})
	}
	return out, procsOut
}

// procStatus reads VmRSS (MiB) and Threads from /proc/<pid>/status.
func procStatus(dir string) (rssMiB float64, threads int) {
	b, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return 0, 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "VmRSS":
			kb, _ := strconv.ParseFloat(f[0], 64)
			rssMiB = kb / 1024
		case "Threads":
			threads, _ = strconv.Atoi(f[0])
		}
	}
	return rssMiB, threads
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times (100
// on every Linux architecture Go runs on).
const clockTicks = 100

// procCPU is the CPU time (user and system, seconds) the process at dir
// has used: /proc/<pid>/stat's utime and stime, the 14th and 15th
// fields (the command, 2nd, may hold spaces: fields are counted after
// its closing parenthesis).
func procCPU(dir string) float64 {
	b, err := os.ReadFile(filepath.Join(dir, "stat"))
	if err != nil {
		return 0
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // from the 3rd field, state
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks
}

// machineCPU reads /proc/stat's first line: the CPU time all cores have
// been busy and in all (seconds).
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return statCPU(line)
}

// statCPU sums /proc/stat's cpu line: user, nice, system, idle, iowait,
// irq, softirq and steal. guest and guest_nice, after them, are already
// counted in user and nice.
func statCPU(line string) (busy, total float64) {
	f := strings.Fields(line)
	if len(f) < 6 || f[0] != "cpu" {
		return 0, 0
	}
	for i, v := range f[1:min(len(f), 9)] {
		n, _ := strconv.ParseFloat(v, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy / clockTicks, total / clockTicks
}

// connections counts the descriptors fds of the process at dir that are
// established TCP connections: what a server holds because peers are
// linked to it, not because it leaks.
func connections(dir string, fds []os.DirEntry) int {
	sockets := map[string]bool{}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			sockets[strings.TrimSuffix(inode, "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join(dir, "net", table))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			// sl local remote st tx:rx tr:when retrnsmt uid timeout inode
			f := strings.Fields(line)
			if len(f) > 9 && f[3] == tcpEstablished && sockets[f[9]] {
				n++
			}
		}
	}
	return n
}

// tcpEstablished is the state TCP_ESTABLISHED as /proc/net/tcp shows it.
const tcpEstablished = "01"

// tailer reads what files gain, line by line, from where it left off.
type tailer struct {
	off map[string]int64
}

// lines calls fn for each complete line path gained since the last call.
func (t *tailer) lines(path string, fn func(line []byte)) error {
	if t.off == nil {
		t.off = map[string]int64{}
	}
	f, err := os.Open(filepath.Clean(path))
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() < t.off[path] {
		t.off[path] = 0 // rotated (kube-apiserver's audit log at 100 MB)
	}
	if _, err := f.Seek(t.off[path], io.SeekStart); err != nil {
		return err
	}
	r := bufio.NewReaderSize(f, 1<<16)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return nil //nolint:nilerr // io.EOF, or a line still being written: read again later
		}
		t.off[path] += int64(len(line))
		fn(bytes.TrimRight(line, "\n"))
	}
}

// Call is one call of a unit's client, as its container log has it.
type Call struct {
	T    time.Time
	Unit string
	// Node is where the client ran.
	Node string
	OK   bool
	// Pod is the pod that answered (OK), or the error.
	Detail string
}

// calls reads the calls the clients logged on each node's disk since the
// last reading. A client pod is client-<unit>-…, its log
// host/var/log/pods/<ns>_<pod>_<uid>/client/<n>.log in CRI format
// ("<time> stdout F ok hello from <pod>").
func (t *tailer) calls(disks map[string]string, ns string) []Call {
	var out []Call
	for node, disk := range disks {
		files, _ := filepath.Glob(filepath.Join(disk, "host/var/log/pods", ns+"_client-*", "client", "*.log"))
		for _, path := range files {
			pod := strings.TrimPrefix(filepath.Base(filepath.Dir(filepath.Dir(path))), ns+"_client-")
			unit, _, _ := strings.Cut(pod, "-")
			_ = t.lines(path, func(line []byte) {
				f := strings.SplitN(string(line), " ", 4)
				if len(f) < 4 || f[2] != "F" {
					return
				}
				ts, err := time.Parse(time.RFC3339Nano, f[0])
				if err != nil {
					return
				}
				word, detail, _ := strings.Cut(f[3], " ")
				c := Call{T: ts, Unit: unit, Node: node, OK: word == "ok", Detail: detail}
				if c.OK {
					c.Detail = strings.TrimPrefix(detail, "hello from ")
				}
				out = append(out, c)
			})
		}
	}
	return out
}

// audit reads the audit log's events since the last reading: the writes
// user made, and when the apiserver answered a kubelet with a server
// error (500 and up).
func (t *tailer) audit(path, user string) (writes []kubetest.AuditEvent, failed []time.Time) {
	_ = t.lines(path, func(line []byte) {
		mine := bytes.Contains(line, []byte(user))
		kubelet := bytes.Contains(line, []byte(`"system:node:`)) && bytes.Contains(line, []byte(`"code":5`))
		if !mine && !kubelet {
			return
		}
		var e kubetest.AuditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return
		}
		if strings.HasPrefix(e.User.Username, "system:node:") && e.ResponseStatus.Code >= 500 {
			failed = append(failed, e.Received)
		}
		if e.User.Username != user {
			return
		}
		switch e.Verb {
		case "create", "update", "patch", "delete", "deletecollection":
			writes = append(writes, e)
		}
	})
	return writes, failed
}

// review tells a TokenReview or an access review: a question to the
// apiserver that stores nothing (atoll-cloud asks one when an agent
// enrolls).
func review(e kubetest.AuditEvent) bool {
	return strings.HasSuffix(e.ObjectRef.Resource, "reviews")
}

// leaseWrite tells a write of a Lease (atoll-cloud's leader election),
// which a quiet installation makes all the time.
func leaseWrite(e kubetest.AuditEvent) bool {
	return e.ObjectRef.Resource == "leases"
}

func (u Usage) String() string {
	return fmt.Sprintf("%d procs, %.0f MiB (max %.0f), %d fds, %d threads", u.Procs, u.RSSMiB, u.MaxRSSMiB, u.FDs, u.Threads)
}

// AgentMetrics is what an agent's admin endpoint says.
type AgentMetrics struct {
	// Behind is the longest a view feed's catch-up has been due
	// (atoll_viewfeed_behind_seconds, the largest over the feeds).
	Behind     float64 `json:"behind"`
	Goroutines float64 `json:"goroutines"`
}

// agentMetrics reads each agent's /metrics (addrs: node → host:port)
// with the admin token; an agent that does not answer within 2 s (its
// node dead or cut off from the host) is left out.
func agentMetrics(ctx context.Context, addrs map[string]string, token string) map[string]AgentMetrics {
	client := &http.Client{Timeout: 2 * time.Second}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]AgentMetrics{}
	for node, addr := range addrs {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
			if err != nil {
				return
			}
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return
			}
			parser := expfmt.NewTextParser(model.UTF8Validation)
			families, err := parser.TextToMetricFamilies(resp.Body)
			if err != nil {
				return
			}
			var m AgentMetrics
			if f := families["atoll_viewfeed_behind_seconds"]; f != nil {
				for _, g := range f.GetMetric() {
					m.Behind = max(m.Behind, g.GetGauge().GetValue())
				}
			}
			if f := families["go_goroutines"]; f != nil && len(f.GetMetric()) > 0 {
				m.Goroutines = f.GetMetric()[0].GetGauge().GetValue()
			}
			mu.Lock()
			out[node] = m
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}
