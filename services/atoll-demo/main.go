// Command atoll-demo runs Atoll locally: a real Kubernetes control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), the
// atoll-cloud application with its embedded hub, and simulated edge sites
// whose nodes each run a real atoll-edge agent (with its endpoints proxy).
// It prints a live status table, the grid's copies and, per node, the
// endpoints of the grid's Service that its proxy serves, until
// interrupted. With --real-nodes the nodes are real (kubelet, containerd,
// kube-proxy) and Atoll runs on them as pods (test/podbed).
//
// Run it with `go tool task demo` (which builds the Kubernetes binaries on
// first use).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/test/testbed"
)

const prog = "atoll-demo"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		// After the first Ctrl-C the demo stops cleanly; a second one
		// kills it at once (the default signal handling again).
		<-ctx.Done()
		stop()
	}()
	cliflags.Main(prog, func() error { return run(ctx, os.Args[1:], os.Stdout) })
}

type options struct {
	units    int
	nodes    int
	duration time.Duration
	interval time.Duration
	hubPort  int
	cluster  bool
	dir      string
	cutAfter time.Duration
	cutFor   time.Duration
	// realNodes runs real kubelets and containerd, Atoll as pods.
	realNodes bool
}

func parse(args []string, out io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("atoll-demo", flag.ContinueOnError)
	fs.IntVar(&o.units, "units", 2, "number of simulated edge sites (NodeUnits)")
	fs.IntVar(&o.nodes, "nodes", 3, "nodes per site")
	fs.DurationVar(&o.duration, "duration", 0, "stop this long after everything is ready, whatever the start took (0: run until interrupted)")
	fs.DurationVar(&o.interval, "interval", 3*time.Second, "status table refresh period")
	fs.IntVar(&o.hubPort, "hub-port", 4222, "embedded hub's client port on 127.0.0.1 (0: random)")
	fs.BoolVar(&o.cluster, "hub-cluster", false, "run the hub as a cluster of three servers that atoll-cloud dials by URL (default: embedded in atoll-cloud)")
	fs.StringVar(&o.dir, "dir", "", "working directory for logs and state, created if missing and kept after exit (default: a new temp dir)")
	fs.DurationVar(&o.cutAfter, "cut-after", 20*time.Second, "cut the first node's cloud link after this long (0: never)")
	fs.DurationVar(&o.cutFor, "cut-for", 60*time.Second, "restore the cut link after this long")
	fs.BoolVar(&o.realNodes, "real-nodes", false, "real nodes (kubelet, containerd, kube-proxy in network namespaces; root, after `go tool task node:build dns:build os:deps`) and Atoll installed on them as pods from its images and manifests")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(out, fs, prog+" [flags]   (stop it with Ctrl-C)")
		}
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, cliflags.Usagef("unexpected argument %q (atoll-demo takes only flags)", fs.Arg(0))
	case o.units < 1 || o.units > 20:
		return o, cliflags.Usagef("--units %d: want 1..20", o.units)
	case o.nodes < 1 || o.nodes > 50:
		return o, cliflags.Usagef("--nodes %d: want 1..50", o.nodes)
	case o.interval <= 0:
		return o, cliflags.Usagef("--interval %v: want a positive duration", o.interval)
	case o.realNodes && o.cluster:
		return o, cliflags.Usagef("--real-nodes installs the embedded hub's overlay: drop --hub-cluster")
	case o.realNodes && o.units*o.nodes > 12:
		return o, cliflags.Usagef("--real-nodes: %d nodes; at most 12 real nodes (--units × --nodes)", o.units*o.nodes)
	}
	return o, nil
}

// workDir makes the demo's working directory: dir, created if missing,
// or a new temporary directory. Either is kept after the demo ends.
func workDir(dir string) (string, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "atoll-demo-")
		if err != nil {
			return "", fmt.Errorf("working directory: %w", err)
		}
		return d, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("--dir %s: %w", dir, err)
	}
	return filepath.Abs(dir)
}

// untilDone is ctx, ended --duration from now when it is set: the demo's
// story runs that long once it is ready, however long the start took.
func (o options) untilDone(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.duration > 0 {
		return context.WithTimeout(ctx, o.duration)
	}
	return context.WithCancel(ctx)
}

// run runs the demo until ctx is done (Ctrl-C, SIGTERM) or --duration
// after it is ready, then stops everything it started. Stopping that way
// is no error. Logs and state stay in the working directory.
func run(ctx context.Context, args []string, out io.Writer) (err error) {
	o, err := parse(args, out)
	if err != nil {
		return err
	}
	if o.dir, err = workDir(o.dir); err != nil {
		return err
	}
	logPath := filepath.Join(o.dir, "atoll-demo.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer logFile.Close()
	log := slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	say := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	say("atoll-demo: logs in %s, Kubernetes and hub state in %s (both kept after exit)", logPath, o.dir)
	say("press Ctrl-C to stop")
	defer func() {
		if ctx.Err() != nil {
			// Interrupted or --duration over: a clean stop, whatever
			// step was cut short.
			err = nil
		}
		if err == nil {
			say("atoll-demo: stopped; logs kept in %s", logPath)
		} else {
			say("atoll-demo: failed; logs kept in %s", logPath)
		}
	}()
	if o.realNodes {
		return runRealNodes(ctx, o, out, log, say)
	}
	say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and atoll-cloud ...")
	start := time.Now()
	bed, err := testbed.Start(ctx, testbed.Options{Dir: o.dir, HubPort: o.hubPort, HubCluster: o.cluster, Grids: true, Agent: withProxy, Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		say("atoll-demo: stopping the edge agents, atoll-cloud and Kubernetes ...")
		bed.Stop()
	}()
	say("ready in %v; kubeconfig: %s", time.Since(start).Round(100*time.Millisecond), bed.Cluster.KubeconfigPath())
	ctx, cancel := o.untilDone(ctx)
	defer cancel()
	say("  status page:    http://%s/ui/", bed.Admin.Addr())
	login := fmt.Sprintf("ATOLL_NATS_URL=%s ATOLL_NATS_CREDS=%s", bed.HubURL(), bed.OperatorCreds)
	say("  watch events:   %s go run ./services/atoll events tail", login)
	say("  nats CLI:       %s go run ./services/atoll nats context   (writes the context \"atoll\")", login)
	say("                  then, with atoll on PATH (go install ./services/atoll):")
	say("                  nats --context atoll sub 'atoll.>' --translate 'atoll decode --subject {{Subject}}'")
	for u := range o.units {
		unit := fmt.Sprintf("site-%c", 'a'+u)
		nodes, err := bed.Sites.AddSite(ctx, unit, o.nodes)
		if err != nil {
			return err
		}
		names := make([]string, len(nodes))
		for i, n := range nodes {
			names[i] = n.Name
		}
		if err := bed.DeployWeb(ctx, unit, names); err != nil {
			return err
		}
		say("site %s: %d nodes with real atoll-edge agents, a web pod on each behind Service %s/web", unit, o.nodes, unit)
	}

	grids, err := newGridClient(bed.Cluster.RESTConfig())
	if err != nil {
		return err
	}
	if err := createGrid(ctx, grids, ""); err != nil {
		return err
	}
	say("grid %s/hello: a DeploymentGrid (one copy per site, two replicas in site-b) and a ServiceGrid (hello-svc)", gridNamespace)
	say("each agent serves kube-proxy's view of the cluster on <node ip>:%s; e.g. kubectl --server http://%s get endpointslices -n %s", proxyPort, net.JoinHostPort(bed.Sites.Nodes()[0].IP, proxyPort), gridNamespace)

	scenario := newScenario(o, bed, say)
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		scenario.step(ctx)
		printStatus(ctx, out, bed)
		printGrids(ctx, out, grids)
		printTraffic(ctx, out, bed)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
