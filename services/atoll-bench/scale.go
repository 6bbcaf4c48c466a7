package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/reporter"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
)

// scaleOptions drive the steady-state scale measurement (--scale).
type scaleOptions struct {
	sizes  []int
	unit   int
	warmup time.Duration
	settle time.Duration // at most this long for atoll-cloud's joining writes to stop
	window time.Duration
	renew  time.Duration
	grace  time.Duration // kube-controller-manager's node monitor grace period
	status time.Duration // simulated kubelets' full status re-post interval
	// followers has each emulated agent follow its views as a real
	// agent does (emulateFeeds).
	followers bool
	// leafs gives each emulated agent a leaf link of its own (its own
	// credentials, TLS: test/leafemu) instead of a share of a service
	// connection.
	leafs bool
	// profileDir, when set, receives a CPU profile of atoll-cloud over
	// the window (cpu-<N>.pprof, from its admin endpoint) and, in a
	// storm with the external hub, one of the hub's server over the
	// storm's first stormProfile (hub-storm-<N>.pprof).
	profileDir string
	// memLimit is the hub's process's memory limit in bytes (atoll-cloud
	// with the embedded hub, or the external server), cloudMemLimit
	// atoll-cloud's with the external hub, as a pod's limits.memory (0:
	// none).
	memLimit, cloudMemLimit int64
	// hub is the hub's shape: hubEmbedded or hubExternal (natsServer is
	// then the stock server's binary).
	hub, natsServer string
	// storm, after each size's window, kills the hub's process with
	// every leaf linked and starts it again (storm.go); stormTimeout
	// bounds the fleet's return.
	storm        bool
	stormTimeout time.Duration

	progress *progress // long phases' progress lines (stderr)
}

// scaleRow is one size's measurement.
type scaleRow struct {
	nodes      int
	cloudCores float64 // atoll-cloud (with its embedded hub, unless hubMiB is set)
	// hubCores and hubMiB: the external hub's server process (its CPU,
	// and the most of its resident memory over the window).
	hubCores, hubMiB float64
	// cloudMiB and cloudMedianMiB: the most and the median of its
	// resident memory, sampled each second of the window.
	cloudMiB, cloudMedianMiB float64
	load1                    float64 // the machine's 1-minute load average at the window's end
	apiCores, etcdCores      float64
	msgsPerNode              float64 // edge→hub messages/s per node
	inPerNode                float64 // hub→edge messages/s per node
	leafLinks, leafsDown     int     // --scale-leafs: the agents' leaf links, and how many the hub cut in the window (down at its end, or linked again)
	pending                  uint64  // ballots not yet handled by health-ballots
	oldest                   time.Duration
	writesPerSec             float64 // atoll-cloud's apiserver writes/s (audit log)
	leaseRenewalsPerSec      float64
	publishedBallots         int64
	publishedTopology        int64
	writes                   map[string]int // atoll-cloud's writes in the window, by verb and resource
	paths                    map[string]int // what those writes changed: JSON patch paths (or the verb of other writes)
	joinWrites               int            // atoll-cloud's writes before the window: the nodes joining
	settled                  time.Duration  // from the end of the warm-up until those writes stopped
	viewsConsumers           int            // consumers of VIEWS at the end of the window
	consumersCreated         int64          // VIEWS consumers created during the window
	reconnects               uint64         // the emulated agents' connections came back (after a cut by the hub)
	ooms                     string         // the memory cgroup's OOM account
	storm                    *stormRow      // --scale-storm
	joinRetries              int64          // --scale-leafs: agents' dials refused while joining, and made again
}

// workDir makes the run's directory (removed when done, unless
// ATOLL_SCALE_KEEP is set) and builds atoll-cloud into it, so that it
// runs in its own process.
func workDir(ctx context.Context, out io.Writer, prefix string) (dir, bin string, done func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", "", nil, err
	}
	done = func() { _ = os.RemoveAll(dir) }
	if os.Getenv("ATOLL_SCALE_KEEP") != "" {
		fmt.Fprintf(out, "keeping %s\n", dir)
		done = func() {}
	}
	bin = filepath.Join(dir, "atoll-cloud")
	fmt.Fprintln(out, "building atoll-cloud ...")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./services/atoll-cloud").CombinedOutput(); err != nil {
		done()
		return "", "", nil, fmt.Errorf("build atoll-cloud (run from the repository root): %w: %s", err, b)
	}
	return dir, bin, done, nil
}

// runScale measures, for each size, the steady state of a real
// installation of that many nodes: a real etcd, kube-apiserver and
// kube-controller-manager (test/kubetest); atoll-cloud in its own
// process and memory cgroup, its hub embedded or (--scale-hub=external)
// a stock nats-server in a process and cgroup of its own, so that their
// CPU and memory are their own; simulated kubelets registering the Nodes
// and renewing their Leases every --scale-renew (test/edgesim); and
// emulated agents publishing what the real ones publish in a steady unit
// — a TopologyUpdate per reporter period and a Ballot per voter
// keep-alive, the first of each at once, spread over the period — on the
// same subjects with the same payloads, over service connections, or
// (--scale-leafs) each over a leaf link of its own (leafs.go). With
// --scale-storm it then kills the hub's process and measures the fleet's
// return (storm.go).
func runScale(ctx context.Context, out io.Writer, o scaleOptions) error {
	dir, bin, done, err := workDir(ctx, out, "atoll-scale-")
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(out, "\nenvironment: %s/%s, %d CPUs, %s; units of %d; kubelet Lease renewal every %v; warm-up %v, then until atoll-cloud's writes stop for 30 s (at most %v), window %v\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), o.unit, o.renew, o.warmup, o.settle, o.window)
	if o.hub == hubExternal {
		fmt.Fprintln(out, "building nats-server ...")
		if o.natsServer, err = buildNATSServer(ctx, dir); err != nil {
			return err
		}
	}
	cg, err := newMemoryCgroup(o.memLimit)
	if err != nil {
		return err
	}
	cg.remove()
	if o.hub == hubExternal {
		fmt.Fprintf(out, "hub: the external-nats overlay's server alone, stock nats-server in its own process, %s\n", strings.Replace(cg.how(), "atoll-cloud ", "", 1))
		if cg, err = newMemoryCgroup(o.cloudMemLimit); err != nil {
			return err
		}
		cg.remove()
	}
	fmt.Fprintln(out, cg.how())
	var rows []scaleRow
	for i, n := range o.sizes {
		// A directory per run, not per size: a size given twice starts
		// from an empty cluster, hub and audit log again.
		fmt.Fprintf(out, "measuring %d nodes ...\n", n)
		r, err := measureScale(ctx, filepath.Join(dir, fmt.Sprintf("%d-%d", i, n)), bin, n, o)
		if err != nil {
			// The sizes measured so far are not lost with this one.
			if len(rows) > 0 {
				_ = printScaleTable(out, rows)
			}
			return fmt.Errorf("%d nodes: %w", n, err)
		}
		rows = append(rows, r)
		if err := printScaleTable(out, []scaleRow{r}); err != nil {
			return err
		}
		if r.storm != nil {
			if err := printStorm(out, []stormRow{*r.storm}); err != nil {
				return err
			}
		}
	}
	if len(rows) > 1 {
		fmt.Fprint(out, "\nall sizes:")
		if err := printScaleTable(out, rows); err != nil {
			return err
		}
	}
	var storms []stormRow
	for _, r := range rows {
		if r.storm != nil {
			storms = append(storms, *r.storm)
		}
	}
	if len(storms) > 0 {
		fmt.Fprint(out, "\nreconnect storm (the hub's process killed with every leaf linked, started again):")
		if err := printStorm(out, storms); err != nil {
			return err
		}
	}
	for _, r := range rows {
		if r.reconnects > 0 {
			fmt.Fprintf(out, "the emulated agents' connections to the hub were cut and came back %d times at %d nodes (each a leaf reconnect for the feeds of up to %d agents)\n", r.reconnects, r.nodes, agentsPerConn)
		}
		if r.joinRetries > 0 {
			fmt.Fprintf(out, "%d agents' dials were refused while joining at %d nodes and made again\n", r.joinRetries, r.nodes)
		}
		if r.ooms != "" {
			fmt.Fprintf(out, "atoll-cloud's memory cgroup at %d nodes: %s\n", r.nodes, r.ooms)
		}
		if len(r.writes) > 0 {
			fmt.Fprintf(out, "atoll-cloud writes in the window at %d nodes: %v; what they changed: %v\n", r.nodes, r.writes, r.paths)
		}
	}
	return nil
}

// printScaleTable prints rows as a table.
func printScaleTable(out io.Writer, rows []scaleRow) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nnodes\tleaf links (cut in window)\tjoin writes\tsettled in\tatoll-cloud(+hub) cores\tRSS MiB max\tRSS MiB median\thub process cores\thub RSS MiB max\tedge→hub msg/s/node\thub→edge msg/s/node\tVIEWS consumers\tcreated in window\tballots pending\toldest unhandled\tatoll writes/s\tapiserver cores\tetcd cores\tlease renewals/s\tload (1 min)")
	for _, r := range rows {
		hubCols := "embedded\tembedded"
		if r.hubMiB > 0 {
			hubCols = fmt.Sprintf("%.3f\t%.0f", r.hubCores, r.hubMiB)
		}
		fmt.Fprintf(w, "%d\t%d (%d)\t%d\t%v\t%.3f\t%.0f\t%.0f\t%s\t%.4f\t%.4f\t%d\t%d\t%d\t%v\t%.2f\t%.2f\t%.2f\t%.0f\t%.2f\n", r.nodes, r.leafLinks, r.leafsDown, r.joinWrites, r.settled.Round(time.Second), r.cloudCores,
			r.cloudMiB, r.cloudMedianMiB, hubCols, r.msgsPerNode, r.inPerNode, r.viewsConsumers, r.consumersCreated, r.pending, r.oldest.Round(time.Millisecond), r.writesPerSec,
			r.apiCores, r.etcdCores, r.leaseRenewalsPerSec, r.load1)
	}
	return w.Flush()
}

// addNodes registers specs with sim, 500 at a time, and tries a batch's
// failed registrations again (up to 5 times, 2 s apart): a loaded
// apiserver refusing a few of thousands of registrations must not end
// the run.
func addNodes(ctx context.Context, sim *edgesim.Simulator, specs []edgesim.NodeSpec, progress func(done int)) error {
	for i := 0; i < len(specs); i += 500 {
		batch := specs[i:min(i+500, len(specs))]
		for attempt := 1; ; attempt++ {
			err := sim.AddNodes(ctx, batch...)
			if err == nil {
				break
			}
			if attempt == 5 || ctx.Err() != nil {
				return err
			}
			// A failed registration is forgotten by the simulator: try
			// those again.
			var failed []edgesim.NodeSpec
			for _, spec := range batch {
				if _, ok := sim.Node(spec.Name); !ok {
					failed = append(failed, spec)
				}
			}
			if len(failed) == 0 {
				return err
			}
			batch = failed
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(2 * time.Second):
			}
		}
		progress(min(i+500, len(specs)))
	}
	return nil
}

// sampleRSS reads pid's resident memory each second until stop is
// closed, and returns the most and the median, in MiB.
func sampleRSS(pid int, stop <-chan struct{}) (maxMiB, medianMiB func() float64) {
	var mu sync.Mutex
	var kib []int64
	sample := func() {
		if v := rssKiB(pid); v > 0 {
			mu.Lock()
			kib = append(kib, v)
			mu.Unlock()
		}
	}
	sample()
	go func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	get := func(median bool) float64 {
		mu.Lock()
		defer mu.Unlock()
		if len(kib) == 0 {
			return 0
		}
		s := slices.Sorted(slices.Values(kib))
		if median {
			return float64(s[len(s)/2]) / 1024
		}
		return float64(s[len(s)-1]) / 1024
	}
	return func() float64 { return get(false) }, func() float64 { return get(true) }
}

// loadAverage is the machine's 1-minute load average (0 if unknown).
func loadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func measureScale(ctx context.Context, dir, bin string, n int, o scaleOptions) (scaleRow, error) {
	row := scaleRow{nodes: n}
	auditDir := filepath.Join(dir, "audit")
	audit, err := kubetest.Audit(auditDir)
	if err != nil {
		return row, err
	}
	// The node lifecycle controller at its production grace period (by
	// default), not the harness's short one: a node is lost when its
	// Lease is --scale-grace old.
	cluster, err := kubetest.StartCluster(ctx, kubetest.Config{Dir: filepath.Join(dir, "kube"), ControllerManager: true,
		NodeMonitorGracePeriod: o.grace, NodeMonitorPeriod: 5 * time.Second,
		ExtraAPIServerFlags: append(audit, "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"),
		Logger:              slog.New(slog.DiscardHandler)})
	if err != nil {
		return row, err
	}
	defer func() { _ = cluster.Stop() }()

	// atoll-cloud, in its own process.
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = natstest.FreePort(); err != nil {
			return row, err
		}
	}
	clientPort, leafPort, adminPort, webhookPort := ports[0], ports[1], ports[2], ports[3]
	certDir := filepath.Join(dir, "webhook")
	if err := cluster.WriteServingCert(certDir, "127.0.0.1"); err != nil {
		return row, err
	}
	hubDir := filepath.Join(dir, "hub")
	cloudLog, err := os.Create(filepath.Join(dir, "atoll-cloud.log"))
	if err != nil {
		return row, err
	}
	defer cloudLog.Close()
	args := []string{"--kubeconfig=" + cluster.KubeconfigPath(), "--leader-elect=false",
		fmt.Sprintf("--admin-addr=127.0.0.1:%d", adminPort), fmt.Sprintf("--webhook-addr=127.0.0.1:%d", webhookPort),
		"--webhook-certs=dir", "--webhook-cert-dir=" + certDir, "--webhook-register=false"}
	// Leaf TLS, as deployed: a certificate of the cluster's CA.
	leafDir := filepath.Join(dir, "leaf-tls")
	if err := cluster.WriteServingCert(leafDir, "127.0.0.1"); err != nil {
		return row, err
	}
	leafCert, leafKey := filepath.Join(leafDir, "tls.crt"), filepath.Join(leafDir, "tls.key")
	var leafCfg *tls.Config
	if o.leafs {
		if leafCfg, err = leafTLS(cluster.CAFile()); err != nil {
			return row, err
		}
	}
	identityDir := filepath.Join(hubDir, "identity")
	var extHub *hubProcess
	if o.hub == hubExternal {
		if extHub, err = startExternalHub(ctx, o.natsServer, hubDir, identityDir, leafCert, leafKey, clientPort, leafPort, o.memLimit, o.profileDir != ""); err != nil {
			return row, err
		}
		defer extHub.stop()
		args = append(args, fmt.Sprintf("--hub-url=nats://127.0.0.1:%d", clientPort), "--identity-dir="+identityDir, "--stream-replicas=1")
	} else {
		args = append(args, "--hub-host=127.0.0.1", "--hub-store-dir="+hubDir,
			fmt.Sprintf("--hub-client-port=%d", clientPort), fmt.Sprintf("--hub-leaf-port=%d", leafPort))
		if o.leafs {
			args = append(args, "--hub-leaf-tls-cert="+leafCert, "--hub-leaf-tls-key="+leafKey)
		}
	}
	cloudLimit := o.memLimit
	if extHub != nil {
		cloudLimit = o.cloudMemLimit
	}
	cg, err := newMemoryCgroup(cloudLimit)
	if err != nil {
		return row, err
	}
	defer cg.remove()
	// startCloud starts atoll-cloud (again, for the reconnect storm: the same
	// flags and store) and waits until it is ready.
	var cloud *exec.Cmd
	var exited chan error
	startCloud := func() error {
		cloud = exec.CommandContext(ctx, bin, args...)
		cg.command(cloud)
		// Killed with the benchmark, however it ends.
		cloud.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cloud.Stdout, cloud.Stderr = cloudLog, cloudLog
		if err := cloud.Start(); err != nil {
			return err
		}
		exited = make(chan error, 1)
		go func(c *exec.Cmd, e chan<- error) { e <- c.Wait() }(cloud, exited)
		if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", adminPort), 2*time.Minute); err != nil {
			return fmt.Errorf("atoll-cloud not ready (see %s): %w", cloudLog.Name(), err)
		}
		return nil
	}
	defer func() {
		if cloud != nil && cloud.Process != nil {
			_ = cloud.Process.Signal(os.Interrupt)
			err := <-exited
			exited <- err
		}
	}()
	// died says whether atoll-cloud ended before the benchmark ended it
	// (an OOM kill at its memory limit, a crash).
	died := func() error {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("atoll-cloud exited during the run (%w; %s; see %s)", err, cg.ooms(), cloudLog.Name())
		default:
			return nil
		}
	}
	if err := startCloud(); err != nil {
		return row, err
	}

	// The emulated agents' connections: service users of the hub's keys,
	// one per agentsPerConn agents, so that a connection carries about
	// what a busy edge server's leaf carries and the hub cutting one (as
	// a slow consumer while nodes join) is a leaf reconnect for a few
	// hundred agents, not all of them.
	keys, err := identity.LoadKeys(identityDir)
	if err != nil {
		return row, err
	}
	issuer := identity.NewIssuer(keys, hub.Default().Domain)
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	userJWT, err := issuer.Service("atoll-scale", pub)
	if err != nil {
		return row, err
	}
	seed, _ := kp.Seed()
	conns := make([]*agentConn, (n+agentsPerConn-1)/agentsPerConn)
	if o.leafs {
		conns = conns[:1] // the benchmark's own reads; the agents have leafs
	}
	for i := range conns {
		if conns[i], err = dialAgents(fmt.Sprintf("nats://127.0.0.1:%d", clientPort), userJWT, string(seed)); err != nil {
			return row, err
		}
		defer conns[i].nc.Close()
	}
	nc, js := conns[0].nc, conns[0].js

	// Nodes and their kubelets.
	sim, err := edgesim.New(cluster.RESTConfig(), edgesim.Config{RenewInterval: o.renew, StatusInterval: o.status,
		Workers: simWorkers(n), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return row, err
	}
	if err := sim.Start(ctx); err != nil {
		return row, err
	}
	defer sim.Stop()
	names := make([]string, n)
	specs := make([]edgesim.NodeSpec, n)
	for i := range n {
		names[i] = fmt.Sprintf("edge-%05d", i)
		specs[i] = edgesim.NodeSpec{Name: names[i], Labels: map[string]string{wellknown.LabelUnit: fmt.Sprintf("u%04d", i/o.unit)}}
	}
	o.progress.begin(fmt.Sprintf("scale %d: registering nodes", n))
	if err := addNodes(ctx, sim, specs, func(done int) { o.progress.count(done, n, "registered") }); err != nil {
		return row, err
	}
	o.progress.end()

	// The agents.
	var ballots, topology atomic.Int64
	var feeds *viewfeed.Metrics
	feedReg := prometheus.NewRegistry()
	if o.followers {
		feeds = viewfeed.NewMetrics(feedReg)
	}
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var agents []*leafAgent
	defer func() {
		for _, a := range agents {
			a.close()
		}
	}()
	if o.leafs {
		units := make([]string, n)
		for i := range specs {
			units[i] = specs[i].Labels[wellknown.LabelUnit]
		}
		o.progress.begin(fmt.Sprintf("scale %d: agents linking (a leaf each, TLS) and catching up with their views", n))
		agents, err = joinLeafAgents(actx, o, issuer, fmt.Sprintf("nats-leaf://127.0.0.1:%d", leafPort), leafCfg, names, units, feeds)
		o.progress.end()
		row.joinRetries = joinRetries.Swap(0)
		if err != nil {
			return row, err
		}
		for i, a := range agents {
			first, last := (i/o.unit)*o.unit, min((i/o.unit+1)*o.unit, n)
			wg.Go(func() { emulateAgent(actx, a.nc, a.js, names[i], units[i], names[first:last], &ballots, &topology) })
		}
	}
	if feeds != nil && !o.leafs {
		// The agents join a connection at a time, each batch once the one
		// before has caught up with its views: every agent reading its
		// spaces at once is a burst the hub answers by cutting the
		// connections as slow consumers, and each cut is a reconnect
		// catch-up for all their feeds.
		o.progress.begin(fmt.Sprintf("scale %d: agents catching up with their views", n))
		for ci, c := range conns {
			var joined sync.WaitGroup
			if up := emulateSharedFeed(actx, hublink.Of(c.nc, c.js), c.leaf, feeds); up != nil {
				joined.Go(func() {
					select {
					case <-up:
					case <-actx.Done():
					}
				})
			}
			for i := ci * agentsPerConn; i < min((ci+1)*agentsPerConn, n); i++ {
				name, unit := names[i], specs[i].Labels[wellknown.LabelUnit]
				joined.Go(func() { emulateFeeds(actx, hublink.Of(c.nc, c.js), c.leaf, name, unit, feeds) })
			}
			joined.Wait()
			if err := ctx.Err(); err != nil {
				return row, err
			}
			o.progress.count(min((ci+1)*agentsPerConn, n), n, "caught up")
		}
		o.progress.end()
	}
	for i, name := range names {
		if o.leafs {
			break
		}
		unit := specs[i].Labels[wellknown.LabelUnit]
		first, last := (i/o.unit)*o.unit, min((i/o.unit+1)*o.unit, n)
		c := conns[i/agentsPerConn]
		wg.Go(func() { emulateAgent(actx, c.nc, c.js, name, unit, names[first:last], &ballots, &topology) })
	}

	if err := o.progress.wait(ctx, fmt.Sprintf("scale %d: warm-up", n), o.warmup); err != nil {
		return row, err
	}
	settleStart := time.Now()
	if row.joinWrites, _, err = settleWrites(ctx, auditDir, o.settle, "--scale-settle"); err != nil {
		return row, err
	}
	row.settled = time.Since(settleStart)
	pids := map[string]int{"cloud": cloud.Process.Pid, "etcd": findProcess(cluster.Dir(), "etcd"), "apiserver": findProcess(cluster.Dir(), "kube-apiserver")}
	if extHub != nil {
		pids["hub"] = extHub.pid()
	}
	before := map[string]time.Duration{}
	for k, pid := range pids {
		before[k] = kubetest.ProcessCPU(pid)
	}
	writes0, err := atollWrites(auditDir)
	if err != nil {
		return row, err
	}
	renew0 := sim.Stats()
	// Consumers the emulated agents create during the window: a steady
	// agent creates one per changed space per check period, for its
	// catch-up; more is a feed catching up again and again, which the
	// hub's CPU and the edge→hub count would hide.
	var created atomic.Int64
	adv, err := nc.Subscribe("$JS.EVENT.ADVISORY.CONSUMER.CREATED."+events.StreamViews+".>", func(*nats.Msg) { created.Add(1) })
	if err != nil {
		return row, err
	}
	defer func() { _ = adv.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return row, err
	}
	leafOut0, leafIn0 := leafMsgs(agents)
	relinked0 := leafReconnects(agents)
	b0, t0, out0, in0 := ballots.Load(), topology.Load(), outMsgs(conns), inMsgs(conns)
	start := time.Now()
	windowDone := make(chan struct{})
	endWindow := sync.OnceFunc(func() { close(windowDone) })
	defer endWindow()
	rssMax, rssMedian := sampleRSS(pids["cloud"], windowDone)
	hubRSS := func() float64 { return 0 }
	if extHub != nil {
		hubRSS, _ = sampleRSS(pids["hub"], windowDone)
	}
	profiled := make(chan error, 1)
	if o.profileDir != "" {
		go func() {
			profiled <- cpuProfile(ctx, fmt.Sprintf("http://127.0.0.1:%d", adminPort), o.window,
				filepath.Join(o.profileDir, fmt.Sprintf("cpu-%d.pprof", n)))
		}()
	} else {
		profiled <- nil
	}
	if err := o.progress.wait(ctx, fmt.Sprintf("scale %d: window", n), o.window); err != nil {
		return row, err
	}
	if err := <-profiled; err != nil {
		return row, err
	}
	secs := time.Since(start).Seconds()
	endWindow()
	if err := died(); err != nil {
		return row, err
	}
	row.ooms = cg.ooms()
	cores := func(k string) float64 { return (kubetest.ProcessCPU(pids[k]) - before[k]).Seconds() / secs }
	row.cloudCores, row.apiCores, row.etcdCores = cores("cloud"), cores("apiserver"), cores("etcd")
	row.cloudMiB, row.cloudMedianMiB, row.load1 = rssMax(), rssMedian(), loadAverage()
	if extHub != nil {
		row.hubCores, row.hubMiB = cores("hub"), hubRSS()
		if err := extHub.died(); err != nil {
			return row, err
		}
	}
	row.publishedBallots, row.publishedTopology = ballots.Load()-b0, topology.Load()-t0
	// Everything the agents' connections sent the hub: ballots, topology
	// and the feeds' catch-ups.
	leafOut, leafIn := leafMsgs(agents)
	if o.leafs {
		// The benchmark's own connection is not an agent's.
		row.msgsPerNode = float64(leafOut-leafOut0) / secs / float64(n)
		row.inPerNode = float64(leafIn-leafIn0) / secs / float64(n)
		row.leafLinks, row.leafsDown = len(agents), leafsDown(agents)+int(leafReconnects(agents)-relinked0)
	} else {
		row.msgsPerNode = float64(outMsgs(conns)-out0) / secs / float64(n)
		row.inPerNode = float64(inMsgs(conns)-in0) / secs / float64(n)
	}
	if feeds != nil {
		row.msgsPerNode += sharedChecksPerNode()
	}
	row.consumersCreated = created.Load()
	for _, c := range conns {
		row.reconnects += c.leaf.reconnects()
	}
	if vs, err := js.Stream(ctx, events.StreamViews); err == nil {
		row.viewsConsumers = vs.CachedInfo().State.Consumers
	}
	writes1, err := atollWrites(auditDir)
	if err != nil {
		return row, err
	}
	row.writesPerSec = float64(sum(writes1)-sum(writes0)) / secs
	row.writes = map[string]int{}
	for k, v := range writes1 {
		if d := v - writes0[k]; d > 0 {
			row.writes[k] = d
		}
	}
	if row.paths, err = writePaths(auditDir, sum(writes0)); err != nil {
		return row, err
	}
	row.leaseRenewalsPerSec = float64(sim.Stats().LeaseRenewals-renew0.LeaseRenewals) / secs
	row.pending, row.oldest = consumerLag(ctx, js, events.BallotConsumer.Name)
	if !o.storm {
		return row, nil
	}
	kube, err := kubernetes.NewForConfig(cluster.RESTConfig())
	if err != nil {
		return row, err
	}
	hubLog := cloudLog.Name()
	if extHub != nil {
		hubLog = extHub.log
	}
	storm, err := runStorm(ctx, n, stormEnv{
		agents: agents, feeds: 4, metrics: feedReg, auditDir: auditDir, hubLog: hubLog, kube: kube,
		timeout: o.stormTimeout, after: time.Minute, progress: o.progress,
		profile: func(ctx context.Context) error {
			if extHub == nil || extHub.profPort == 0 {
				return nil
			}
			return cpuProfile(ctx, fmt.Sprintf("http://127.0.0.1:%d", extHub.profPort), stormProfile,
				filepath.Join(o.profileDir, fmt.Sprintf("hub-storm-%d.pprof", n)))
		},
		kill: func() error {
			if extHub != nil {
				return extHub.kill()
			}
			if err := cloud.Process.Kill(); err != nil {
				return err
			}
			err := <-exited
			exited <- err // for the deferred stop, if the start fails
			return nil
		},
		died: func() error {
			if extHub != nil {
				return extHub.died()
			}
			return died()
		},
		restart: func() (int, error) {
			if extHub != nil {
				return extHub.restart()
			}
			if err := startCloud(); err != nil {
				return 0, err
			}
			return cloud.Process.Pid, nil
		},
	})
	if err != nil {
		return row, fmt.Errorf("reconnect storm: %w", err)
	}
	row.storm = &storm
	return row, nil
}

// simWorkers is how many goroutines renew n simulated kubelets' Leases:
// one per 50 nodes, at least edgesim's default (16 renewed 10,000 Leases
// too slowly: Nodes went NotReady and units flapped).
func simWorkers(n int) int { return max(edgesim.DefaultWorkers, n/50) }

// emulatedRate is the messages per second an emulated agent publishes to
// the hub in a steady unit: a TopologyUpdate every reporter period and a
// keep-alive Ballot every voter keep-alive.
func emulatedRate() float64 {
	return 1/reporter.DefaultConfig().Period.Seconds() + 1/voter.DefaultConfig().KeepAlive.Seconds()
}

// emulateFeeds follows node's views as a real agent does: a view feed
// (edge/viewfeed, the agent's own code) for each of the four spaces of
// its own (its assignment, its unit's view, the host records, and the
// endpoints proxy's unit space), each a core subscription on the
// republished views and a short-lived consumer for its catch-ups (at
// start, after a reconnect of its connection, and at its checks).
// Nothing is held on the hub between catch-ups. It returns when every
// feed has caught up once (or ctx is done). The fifth space a real agent
// follows, the one shared by all units, is followed once per connection
// (emulateSharedFeed).
func emulateFeeds(ctx context.Context, link viewfeed.Link, leaf viewfeed.Node, node, unit string, m *viewfeed.Metrics) {
	assign, _ := events.AssignmentSubject(node)
	view, _ := events.UnitViewSubject(unit)
	hosts, _ := events.HostsSubject(unit)
	objects, _ := events.UnitViewSubjects(unit)
	var up []<-chan struct{}
	for _, sp := range []struct{ name, filter string }{
		{"assignment", assign}, {"unit_view", view}, {"hosts", hosts}, {"proxy_unit", objects},
	} {
		if f := runFeed(ctx, link, leaf, sp.name, sp.filter, m); f != nil {
			up = append(up, f.CaughtUp())
		}
	}
	for _, c := range up {
		select {
		case <-c:
		case <-ctx.Done():
			return
		}
	}
}

// emulateSharedFeed follows the view space shared by all units
// (atoll.view._all.>: every Service, EndpointSlice, Endpoints and every
// Node's labels) once for the agents of a connection. A real agent reads
// all of it when it starts — 10,000 Node views at 10,000 nodes, about
// 2 MB — which one benchmark process cannot do 10,000 times over (10^8
// messages); the hub's steady-state cost of the space is a direct get
// per agent every check period, which the edge→hub column leaves out
// (sharedChecksPerNode).
func emulateSharedFeed(ctx context.Context, link viewfeed.Link, leaf viewfeed.Node, m *viewfeed.Metrics) <-chan struct{} {
	if f := runFeed(ctx, link, leaf, "proxy_shared", events.SharedSpaceSubjects(), m); f != nil {
		return f.CaughtUp()
	}
	return nil
}

// sharedChecksPerNode is the messages per second a real agent sends the
// hub for the shared space in a steady state: a light check (one direct
// get) per check period.
func sharedChecksPerNode() float64 { return 1 / viewfeed.DefaultConfig().CheckPeriod.Seconds() }

func runFeed(ctx context.Context, link viewfeed.Link, leaf viewfeed.Node, name, filter string, m *viewfeed.Metrics) *viewfeed.Feed {
	cfg := viewfeed.DefaultConfig()
	// What waits during a catch-up of a quiet space: a real agent's
	// default buffer, 10,000 times over, would be the bench's memory.
	cfg.Buffer = 64
	// 40,000 feeds each looking at their leaf link every 250 ms were
	// 160,000 wake-ups a second in one process; the connections rarely
	// reconnect once the agents have joined.
	cfg.LeafPoll = 5 * time.Second
	f, err := viewfeed.New(cfg, link, leaf, viewfeed.Options{Name: name, Filter: filter,
		Apply: func(context.Context, viewfeed.Msg) error { return nil }}, slog.New(slog.DiscardHandler), m)
	if err != nil {
		return nil
	}
	go func() { _ = f.Run(ctx) }()
	return f
}

// agentsPerConn is how many emulated agents share a connection to the
// hub: 500 agents' 2,001 feed subscriptions on one connection, where a
// real edge server's leaf carries one agent's five.
const agentsPerConn = 500

// agentConn is a connection that emulated agents share, with its leaf
// link.
type agentConn struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	leaf *connLeaf
}

func dialAgents(url, userJWT, seed string) (*agentConn, error) {
	nc, err := nats.Connect(url, nats.UserJWTAndSeed(userJWT, seed), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	js, err := jetstream.NewWithDomain(nc, hub.Default().Domain)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &agentConn{nc: nc, js: js, leaf: newConnLeaf(nc)}, nil
}

// outMsgs is what the connections have sent the hub.
func outMsgs(conns []*agentConn) (n uint64) {
	for _, c := range conns {
		n += c.nc.Stats().OutMsgs
	}
	return n
}

// inMsgs is what the connections have received from the hub.
func inMsgs(conns []*agentConn) (n uint64) {
	for _, c := range conns {
		n += c.nc.Stats().InMsgs
	}
	return n
}

// connLeaf is the leaf link of the emulated agents on one connection: a
// new link after each of its reconnects (the hub may cut it as a slow
// consumer while the nodes join), after which the feeds catch up as an
// agent's do after a leaf reconnect.
type connLeaf struct{ id atomic.Uint64 }

func newConnLeaf(nc *nats.Conn) *connLeaf {
	l := &connLeaf{}
	l.id.Store(1)
	nc.SetReconnectHandler(func(*nats.Conn) { l.id.Add(1) })
	return l
}

func (l *connLeaf) HubLink() natsnode.HubLink { return natsnode.HubLink{ID: l.id.Load()} }

// reconnects is how many times the connection came back.
func (l *connLeaf) reconnects() uint64 { return l.id.Load() - 1 }

// emulateAgent publishes what node's agent publishes in a steady unit of
// members: its TopologyUpdate every reporter period and its Ballot (every
// other member healthy) every voter keep-alive, the first of each at a
// random point of the period.
func emulateAgent(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, node, unit string, members []string, ballots, topology *atomic.Int64) {
	rc, vc := reporter.DefaultConfig(), voter.DefaultConfig()
	tsubj, _ := events.TopologySubject(node)
	bsubj, _ := events.BallotSubject(unit, node)
	since := timestamppb.Now()
	next := func(period time.Duration) *time.Timer { return time.NewTimer(rand.N(period)) }
	tt, bt := next(rc.Period), next(vc.KeepAlive)
	defer tt.Stop()
	defer bt.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tt.C:
			u := &atollv1.TopologyUpdate{Node: node, Unit: unit, Version: "scale", Time: timestamppb.Now(),
				RouteUrl: "nats-route://127.0.0.1:6222", Addresses: []*atollv1.NodeAddress{{Type: "InternalIP", Address: "172.16.0.1"}}}
			if events.Publish(nc, tsubj, u, node+"@"+strconv.FormatInt(u.GetTime().AsTime().UnixNano(), 10)) == nil {
				topology.Add(1)
			}
			tt.Reset(rc.Period)
		case <-bt.C:
			now := time.Now()
			b := &atollv1.Ballot{Voter: node, Unit: unit, Time: timestamppb.New(now), Members: uint32(len(members)),
				Ttl: durationpb.New(vc.TTL), Keepalive: true}
			for _, m := range members {
				if m != node {
					b.Votes = append(b.Votes, &atollv1.Vote{Node: m, Verdict: atollv1.Verdict_VERDICT_HEALTHY,
						Normal: uint32(len(members) - 2), Since: since})
				}
			}
			pctx, cancel := context.WithTimeout(ctx, vc.AckTimeout)
			_, err := events.PublishDurable(pctx, js, bsubj, b, node+"@"+strconv.FormatInt(now.UnixNano(), 16))
			cancel()
			if err == nil {
				ballots.Add(1)
			}
			bt.Reset(vc.KeepAlive)
		}
	}
}

// consumerLag is what the durable consumer name has not handled yet and
// how old the oldest of it is.
func consumerLag(ctx context.Context, js jetstream.JetStream, name string) (uint64, time.Duration) {
	c, err := js.Consumer(ctx, events.StreamHealth, name)
	if err != nil {
		return 0, 0
	}
	info, err := c.Info(ctx)
	if err != nil {
		return 0, 0
	}
	pending := info.NumPending + uint64(info.NumAckPending)
	if pending == 0 {
		return 0, 0
	}
	s, err := js.Stream(ctx, events.StreamHealth)
	if err != nil {
		return pending, 0
	}
	m, err := s.GetMsg(ctx, info.AckFloor.Stream+1)
	if err != nil {
		return pending, 0
	}
	return pending, time.Since(m.Time)
}

// atollWrites counts atoll-cloud's writes in the audit log so far, by
// verb and resource.
func atollWrites(auditDir string) (map[string]int, error) {
	out := map[string]int{}
	evs, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range evs {
		if strings.HasPrefix(e.UserAgent, wellknown.FieldManager) {
			switch e.Verb {
			case "create", "update", "patch", "delete":
				out[e.Verb+" "+e.ObjectRef.Resource]++
			}
		}
	}
	return out, nil
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

func waitReady(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %s", resp.Status)
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// rssKiB is the resident set of pid.
func rssKiB(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// findProcess is the pid of the process running binary name with an
// argument under dir (the cluster's own), 0 if none.
func findProcess(dir, name string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 0 && filepath.Base(args[0]) == name && strings.Contains(string(b), dir) {
			return pid
		}
	}
	return 0
}

// settleWrites waits, at most limit, until atoll-cloud has written nothing
// for settleQuiet: the writes of the nodes joining (first verdict
// annotations, at the informational client's rate) must not be counted as
// steady state. It returns how many writes atoll-cloud made until then
// and when it saw the count change last, and an error naming flag when
// they never stopped: a steady state that writes.
func settleWrites(ctx context.Context, auditDir string, limit time.Duration, flag string) (int, time.Time, error) {
	const poll, settleQuiet = 5 * time.Second, 30 * time.Second
	deadline := time.Now().Add(limit)
	last, lastChange := -1, time.Now()
	for {
		w, err := atollWrites(auditDir)
		if err != nil {
			return 0, lastChange, err
		}
		if n := sum(w); n != last {
			last, lastChange = n, time.Now()
		}
		if time.Since(lastChange) >= settleQuiet {
			return last, lastChange, nil
		}
		if time.Now().After(deadline) {
			return last, lastChange, fmt.Errorf("atoll-cloud still writing %v later (%d writes so far; %s)", limit, last, flag)
		}
		select {
		case <-ctx.Done():
			return 0, lastChange, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// writePaths tells what atoll-cloud's writes after the first skip changed:
// the paths of their JSON patches ("/metadata/annotations/atoll.io~1…"),
// the top-level fields of other patches, or the verb and resource.
func writePaths(auditDir string, skip int) (map[string]int, error) {
	f, err := os.Open(kubetest.AuditLog(auditDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	seen := 0
	for sc.Scan() {
		var e struct {
			kubetest.AuditEvent
			RequestObject json.RawMessage `json:"requestObject"`
		}
		if json.Unmarshal(sc.Bytes(), &e) != nil || !strings.HasPrefix(e.UserAgent, wellknown.FieldManager) {
			continue
		}
		switch e.Verb {
		case "create", "update", "patch", "delete":
		default:
			continue
		}
		if seen++; seen <= skip {
			continue
		}
		var ops []struct {
			Path string `json:"path"`
		}
		var obj map[string]json.RawMessage
		switch {
		case json.Unmarshal(e.RequestObject, &ops) == nil && len(ops) > 0:
			for _, op := range ops {
				out[e.ObjectRef.Resource+" "+op.Path]++
			}
		case json.Unmarshal(e.RequestObject, &obj) == nil && len(obj) > 0:
			for _, k := range slices.Sorted(maps.Keys(obj)) {
				out[e.ObjectRef.Resource+" "+k]++
			}
		default:
			out[e.Verb+" "+e.ObjectRef.Resource]++
		}
	}
	return out, sc.Err()
}

// cpuProfile saves a CPU profile of the process serving admin (its
// /debug/pprof/profile) over d into path.
func cpuProfile(ctx context.Context, admin string, d time.Duration, path string) error {
	secs := max(1, int(d.Seconds())-1)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + time.Minute}).Do(req)
	if err != nil {
		return fmt.Errorf("cpu profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("cpu profile: %s", resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("cpu profile: %w", err)
	}
	return f.Close()
}
