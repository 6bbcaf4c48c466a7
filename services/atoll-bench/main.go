// Command atoll-bench measures distributed health on a whole local
// installation (real Kubernetes control plane, hub, cloud services, real
// atoll-edge agents on simulated nodes) and prints tables with the
// environment:
//
//   - detection: a node dies (agent, kubelet and Lease stop) → the cloud's
//     verdict is unhealthy;
//   - protection: a node's cloud link is cut (Lease and leaf link stop) →
//     the node lifecycle controller marks it Unknown → Atoll protects it;
//     and whether its endpoint was ever seen not ready;
//   - probe traffic: bytes per second per node for units of 10, 50 and 200
//     nodes: measured on a real unit (default 10 nodes), and computed for
//     the others from the encoded sizes of real reports and votes.
//
// Run it with `go tool task bench:health`. With --scale it measures
// instead the steady state of installations of the given sizes (scale.go;
// `go tool task bench:scale`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/edge/reporter"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/internal/cliflags"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/testbed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cliflags.Main("atoll-bench", func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

type options struct {
	trials      int
	unitSize    int
	trafficSize int
	window      time.Duration
	grace       time.Duration
	scale       scaleOptions
	outage      bool
	outageOpts  outageOptions
	progress    *progress // long phases' progress lines (stderr)
}

// run runs the benchmark: its tables go to out, the progress of its long
// phases to errOut.
func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	var o options
	o.progress = newProgress(errOut)
	o.scale.progress = o.progress
	fs := flag.NewFlagSet("atoll-bench", flag.ContinueOnError)
	fs.IntVar(&o.trials, "trials", 5, "trials per latency measurement")
	fs.IntVar(&o.unitSize, "unit", 5, "nodes in the unit used for latency trials")
	fs.IntVar(&o.trafficSize, "traffic-unit", 10, "nodes in the unit whose probe traffic is measured")
	fs.DurationVar(&o.window, "traffic-window", 5*time.Minute, "how long probe traffic is measured")
	fs.DurationVar(&o.grace, "node-monitor-grace", 5*time.Second, "kube-controller-manager's --node-monitor-grace-period")
	var sizes cliflags.List
	fs.Var(&sizes, "scale", "comma-separated node counts: measure the steady state of installations of these sizes instead (e.g. 1000,2000,5000,10000)")
	fs.IntVar(&o.scale.unit, "scale-unit", 10, "nodes per unit in the scale measurement")
	fs.DurationVar(&o.scale.warmup, "scale-warmup", 2*time.Minute, "scale: time after every node is registered before measuring")
	fs.DurationVar(&o.scale.settle, "scale-settle", 20*time.Minute, "scale: after the warm-up, at most this long until atoll-cloud's writes of the joining nodes stop (30 s without one); a steady state that keeps writing fails the run")
	fs.DurationVar(&o.scale.window, "scale-window", 5*time.Minute, "scale: how long each size is measured")
	fs.DurationVar(&o.scale.renew, "scale-renew", 10*time.Second, "scale: simulated kubelets' Lease renewal interval (a kubelet's is 10 s)")
	fs.DurationVar(&o.scale.grace, "scale-grace", 40*time.Second, "scale: kube-controller-manager's --node-monitor-grace-period (production's 40 s; longer with a longer --scale-renew)")
	fs.DurationVar(&o.scale.status, "scale-status", 5*time.Minute, "scale: simulated kubelets' full Node status re-post interval (a kubelet's nodeStatusReportFrequency is 5m)")
	fs.StringVar(&o.scale.profileDir, "scale-cpuprofile", "", "scale: directory to save a CPU profile of atoll-cloud over each window in (cpu-<N>.pprof), and of the external hub over a storm's first 2 minutes (hub-storm-<N>.pprof)")
	fs.BoolVar(&o.scale.followers, "scale-followers", true, "scale: each emulated agent follows its five view spaces as a real agent does (edge/viewfeed: core subscriptions on the republished views, a short-lived consumer per catch-up; assignment, unit view, host records, its unit's and the shared object views)")
	memLimit := fs.String("scale-memory-limit", "2Gi", "scale: the hub's process's memory limit (atoll-cloud with the embedded hub, or the external server), as both overlays' limits.memory (a memory cgroup of its own when the benchmark may make one, else GOMEMLIMIT only; 0: none)")
	cloudMemLimit := fs.String("scale-cloud-memory-limit", "1Gi", "scale: with --scale-hub=external, atoll-cloud's memory limit, as the external-nats overlay's")
	fs.StringVar(&o.scale.hub, "scale-hub", hubEmbedded, "scale: the hub's shape: embedded (in atoll-cloud's process, overlays/embedded-hub) or external (the external-nats overlay's server alone: stock nats-server in a process and memory cgroup of its own, measured apart from atoll-cloud)")
	fs.BoolVar(&o.scale.storm, "scale-storm", false, "scale (with --scale-leafs): after each size's window, kill the hub's process (SIGKILL: atoll-cloud with its embedded hub, or the external server) with every leaf linked and start it again on the same store; report how long until every agent is linked again and caught up, links cut again, slow consumers, peak RSS, Atoll's writes and wrong verdicts")
	fs.DurationVar(&o.scale.stormTimeout, "scale-storm-timeout", 10*time.Minute, "scale: at most this long, after the kill, for every agent to link again and catch up")
	fs.BoolVar(&o.scale.leafs, "scale-leafs", false, "scale: each emulated agent links to the hub over a leaf connection of its own, with its own edge credentials and TLS (test/leafemu), instead of sharing a service connection with 499 others")
	fs.BoolVar(&o.outage, "scale-outage", false, "scale: run the mass outage at each size instead of the steady state (outage.go)")
	fs.IntVar(&o.outageOpts.units, "outage-units", 5, "mass outage: units cut whole")
	fs.IntVar(&o.outageOpts.scatter, "outage-scatter", 50, "mass outage: other units that lose one node each")
	fs.IntVar(&o.outageOpts.deadEvery, "outage-dead-every", 5, "mass outage: every n-th scattered node is really dead (its peers vote it unhealthy; 0: none)")
	fs.DurationVar(&o.outageOpts.toleration, "outage-toleration", 30*time.Second, "mass outage: the pods' unreachable and not-ready toleration")
	fs.DurationVar(&o.outageOpts.killAfter, "outage-kill-after", 15*time.Second, "mass outage: when, after the cut, one hub server is killed")
	fs.DurationVar(&o.outageOpts.settle, "outage-settle", 10*time.Minute, "mass outage: after the heal, at most this long until Atoll's writes stop (30 s without one)")
	fs.BoolVar(&o.outageOpts.zones, "outage-zones", true, "mass outage: each unit is a KCM zone (topology.kubernetes.io/zone = unit); false: one zone for the whole fleet")
	fs.Float64Var(&o.outageOpts.evictionRate, "outage-eviction-rate", 0.1, "mass outage: kube-controller-manager's --node-eviction-rate (its default, 0.1: nodes tainted per second in a zone)")
	fs.DurationVar(&o.outageOpts.quiet, "outage-quiet", time.Minute, "mass outage: window after the heal's writes stopped in which Atoll's writes are counted (want 0)")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(out, fs, "atoll-bench [flags]")
		}
		return err
	}
	for _, l := range []struct {
		flag, v string
		to      *int64
	}{{"--scale-memory-limit", *memLimit, &o.scale.memLimit}, {"--scale-cloud-memory-limit", *cloudMemLimit, &o.scale.cloudMemLimit}} {
		q, err := resource.ParseQuantity(l.v)
		if err != nil || q.Sign() < 0 {
			return cliflags.Usagef("%s %q: want a quantity such as 2Gi (0: none)", l.flag, l.v)
		}
		*l.to = q.Value()
	}
	for _, v := range sizes {
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			return cliflags.Usagef("--scale %q: want node counts of at least 2", v)
		}
		o.scale.sizes = append(o.scale.sizes, n)
	}
	switch {
	case fs.NArg() > 0:
		return cliflags.Usagef("unexpected argument %q (atoll-bench takes only flags)", fs.Arg(0))
	case len(o.scale.sizes) > 0 && (o.scale.unit < 2 || o.scale.window <= 0 || o.scale.renew <= 0 || o.scale.renew >= o.scale.grace || o.scale.warmup < 0 || o.scale.settle <= 0 || o.scale.status <= 0):
		return cliflags.Usagef("--scale-unit must be at least 2, --scale-window positive, --scale-settle, --scale-status and --scale-renew positive, --scale-renew under --scale-grace")
	case o.scale.hub != hubEmbedded && o.scale.hub != hubExternal:
		return cliflags.Usagef("--scale-hub %q: want embedded or external", o.scale.hub)
	case o.scale.storm && (!o.scale.leafs || !o.scale.followers || o.scale.stormTimeout <= 0):
		return cliflags.Usagef("--scale-storm needs --scale-leafs and --scale-followers (it counts the agents' links and their feeds' catch-ups), and a positive --scale-storm-timeout")
	case o.outage && len(o.scale.sizes) == 0:
		return cliflags.Usagef("--scale-outage needs --scale sizes")
	case o.outage && (o.outageOpts.units < 0 || o.outageOpts.scatter < 0 || o.outageOpts.units+o.outageOpts.scatter == 0 || o.outageOpts.deadEvery < 0):
		return cliflags.Usagef("--outage-units and --outage-scatter must not be negative and not both 0, --outage-dead-every not negative")
	case o.outage && (o.outageOpts.toleration < time.Second || o.outageOpts.killAfter < 0 || o.outageOpts.settle <= 0 || o.outageOpts.quiet <= 0 || o.outageOpts.evictionRate <= 0):
		return cliflags.Usagef("--outage-toleration must be at least 1s, --outage-kill-after not negative, --outage-settle, --outage-quiet and --outage-eviction-rate positive")
	case o.outage:
		return runOutage(ctx, out, o.scale, o.outageOpts)
	case len(o.scale.sizes) > 0:
		return runScale(ctx, out, o.scale)
	case o.trials < 1:
		return cliflags.Usagef("--trials %d: want at least 1", o.trials)
	case o.unitSize < 3:
		return cliflags.Usagef("--unit %d: want at least 3", o.unitSize)
	case o.trafficSize < 2:
		return cliflags.Usagef("--traffic-unit %d: want at least 2", o.trafficSize)
	}
	dir, err := os.MkdirTemp("", "atoll-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	logFile, err := os.Create(filepath.Join(dir, "atoll.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()

	fmt.Fprintln(out, "starting the installation ...")
	bed, err := testbed.Start(ctx, testbed.Options{
		Dir: dir, Net: 3,
		Logger: slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Kube:   kubetest.Config{NodeMonitorGracePeriod: o.grace},
		// The traffic unit's agents run at the defaults (the test
		// harness reports topology every 2 s): its messages to the hub
		// are the calibration of bench:scale's emulated agents.
		Agent: func(c *edgeapp.Config) {
			if c.Reporter.Unit == trafficUnit {
				c.Reporter.Period = reporter.DefaultConfig().Period
			}
		},
	})
	if err != nil {
		return err
	}
	defer bed.Stop()

	env(out, o)
	if err := latency(ctx, out, bed, o); err != nil {
		return err
	}
	return traffic(ctx, out, bed, o)
}

func env(out io.Writer, o options) {
	p, v := prober.DefaultConfig(), voter.DefaultConfig()
	fmt.Fprintf(out, "\nenvironment: %s/%s, %d CPUs, %s, nats-server %s, kube %s\n",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), server.VERSION, "v1.36.3")
	fmt.Fprintf(out, "settings: probe period %v, report timeout %v, ballot keep-alive %v, node-monitor-grace-period %v, node-monitor-period 1s\n",
		p.Period, v.Timeout, v.KeepAlive, o.grace)
}

type stats []time.Duration

func (s stats) row() string {
	if len(s) == 0 {
		return "-\t-\t-"
	}
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	return fmt.Sprintf("%s\t%s\t%s", r(s[len(s)/2]), r(sum/time.Duration(len(s))), r(s[len(s)-1]))
}

// poll returns how long it took until cond held (checked every 10 ms).
func poll(ctx context.Context, within time.Duration, cond func() bool) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("not within %v", within)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return time.Since(start), nil
}

func latency(ctx context.Context, out io.Writer, bed *testbed.Bed, o options) error {
	nodes, err := bed.Sites.AddSite(ctx, "bench", o.unitSize)
	if err != nil {
		return err
	}
	client := bed.Cluster.Client()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	if err := bed.DeployWeb(ctx, "bench", names); err != nil {
		return err
	}
	verdict := func(node string) atollv1.Verdict { return bed.Health.Tally(node).Verdict }
	healthyAll := func() bool {
		for _, n := range nodes {
			if verdict(n.Name) != atollv1.Verdict_VERDICT_HEALTHY {
				return false
			}
		}
		return true
	}
	if _, err := poll(ctx, time.Minute, healthyAll); err != nil {
		return fmt.Errorf("unit never healthy: %w", err)
	}

	var detect stats
	o.progress.begin(fmt.Sprintf("latency: %d trials of a dying node", o.trials))
	for i := range o.trials {
		o.progress.count(i, o.trials, "trials")
		x := nodes[i%len(nodes)].Name
		start := time.Now()
		if err := bed.Sites.StopAgent(ctx, x); err != nil {
			return err
		}
		_ = bed.Sites.StopKubelet(x)
		_ = bed.Kubelet.Partition(x)
		if _, err := poll(ctx, time.Minute, func() bool { return verdict(x) == atollv1.Verdict_VERDICT_UNHEALTHY }); err != nil {
			return fmt.Errorf("dead node %s never judged unhealthy: %w", x, err)
		}
		detect = append(detect, time.Since(start))
		if err := revive(ctx, bed, x); err != nil {
			return err
		}
		if _, err := poll(ctx, 2*time.Minute, healthyAll); err != nil {
			return fmt.Errorf("unit not healthy again after reviving %s: %w", x, err)
		}
	}

	o.progress.end()
	var lost, protect stats
	gaps := 0
	o.progress.begin(fmt.Sprintf("latency: %d trials of a cut cloud link", o.trials))
	for i := range o.trials {
		o.progress.count(i, o.trials, "trials")
		x := nodes[i%len(nodes)].Name
		pod := testbed.WebPod(x)
		start := time.Now()
		_ = bed.Kubelet.Partition(x)
		_ = bed.Sites.SetLeaf(x, false)
		sawNotReady := false
		var unknownAt time.Time
		d, err := poll(ctx, 2*time.Minute, func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, x, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if unknownAt.IsZero() && health.ReadyStatus(n) == corev1.ConditionUnknown {
				unknownAt = time.Now()
			}
			if !endpointReady(ctx, bed, pod) {
				sawNotReady = true
				return false
			}
			return !unknownAt.IsZero() && bed.Health.Protected(x) && !hasNoExecute(n)
		})
		if err != nil {
			return fmt.Errorf("partitioned node %s never protected: %w", x, err)
		}
		lost = append(lost, unknownAt.Sub(start))
		protect = append(protect, start.Add(d).Sub(unknownAt))
		if sawNotReady {
			gaps++
		}
		_ = bed.Sites.SetLeaf(x, true)
		_ = bed.Kubelet.Heal(x)
		if _, err := poll(ctx, 2*time.Minute, func() bool {
			n, err := client.CoreV1().Nodes().Get(ctx, x, metav1.GetOptions{})
			return err == nil && health.ReadyStatus(n) == corev1.ConditionTrue && healthyAll() && endpointReady(ctx, bed, pod)
		}); err != nil {
			return fmt.Errorf("%s did not recover: %w", x, err)
		}
	}

	o.progress.end()
	fmt.Fprintf(out, "\nhealth latency, unit of %d nodes, %d trials\n", o.unitSize, o.trials)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "measurement\tp50\tmean\tmax")
	fmt.Fprintf(w, "node dies → cloud verdict unhealthy\t%s\n", detect.row())
	fmt.Fprintf(w, "cloud link cut → KCM marks Unknown (grace %v)\t%s\n", o.grace, lost.row())
	fmt.Fprintf(w, "KCM marks Unknown → Atoll protects (no NoExecute, endpoint ready; 10 ms polls)\t%s\n", protect.row())
	_ = w.Flush()
	fmt.Fprintf(out, "endpoint seen not ready during a partition: %d of %d trials\n", gaps, o.trials)
	return nil
}

func revive(ctx context.Context, bed *testbed.Bed, x string) error {
	if err := bed.Sites.StartKubelet(x); err != nil {
		return err
	}
	if err := bed.Kubelet.Heal(x); err != nil {
		return err
	}
	return bed.Sites.StartAgent(ctx, x)
}

func hasNoExecute(n *corev1.Node) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoExecute
	})
}

func endpointReady(ctx context.Context, bed *testbed.Bed, pod string) bool {
	ok, err := bed.EndpointReady(ctx, "bench", pod)
	return err == nil && ok
}
