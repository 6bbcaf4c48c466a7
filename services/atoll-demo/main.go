// Command atoll-demo runs Atoll locally: a real Kubernetes control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), the
// atoll-cloud application with its embedded hub, and simulated edge sites
// whose nodes each run a real atoll-edge agent. It prints a live status
// table until interrupted.
//
// Run it with `go tool task demo` (which builds the Kubernetes binaries on
// first use).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/internal/testenv/testbed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-demo:", err)
		os.Exit(1)
	}
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
}

func parse(args []string) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("atoll-demo", flag.ContinueOnError)
	fs.IntVar(&o.units, "units", 2, "number of simulated edge sites (NodeUnits)")
	fs.IntVar(&o.nodes, "nodes", 3, "nodes per site")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until interrupted)")
	fs.DurationVar(&o.interval, "interval", 3*time.Second, "status table refresh period")
	fs.IntVar(&o.hubPort, "hub-port", 4222, "embedded hub's client port on 127.0.0.1 (0: random)")
	fs.BoolVar(&o.cluster, "hub-cluster", false, "run the hub as a cluster of three servers that atoll-cloud dials by URL (default: embedded in atoll-cloud)")
	fs.StringVar(&o.dir, "dir", "", "working directory for logs and state (default: a new temp dir)")
	fs.DurationVar(&o.cutAfter, "cut-after", 20*time.Second, "cut the first node's cloud link after this long (0: never)")
	fs.DurationVar(&o.cutFor, "cut-for", 60*time.Second, "restore the cut link after this long")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.units < 1 || o.units > 20:
		return o, fmt.Errorf("--units %d: want 1..20", o.units)
	case o.nodes < 1 || o.nodes > 50:
		return o, fmt.Errorf("--nodes %d: want 1..50", o.nodes)
	case o.interval <= 0:
		return o, fmt.Errorf("--interval must be positive")
	}
	return o, nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	if o.dir == "" {
		if o.dir, err = os.MkdirTemp("", "atoll-demo-"); err != nil {
			return err
		}
		defer os.RemoveAll(o.dir)
	}
	logPath := filepath.Join(o.dir, "atoll-demo.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	log := slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo}))
	say := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	say("atoll-demo: logs in %s", logPath)
	say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and atoll-cloud ...")
	start := time.Now()
	bed, err := testbed.Start(ctx, testbed.Options{Dir: o.dir, HubPort: o.hubPort, HubCluster: o.cluster, Logger: log})
	if err != nil {
		return err
	}
	defer bed.Stop()
	say("ready in %v; kubeconfig: %s", time.Since(start).Round(100*time.Millisecond), bed.Cluster.KubeconfigPath())
	say("  watch events: ATOLL_NATS_URL=%s ATOLL_NATS_USER=operator ATOLL_NATS_PASSWORD=%s go run ./services/atoll events tail", bed.HubURL(), bed.Operator)
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

	scenario := newScenario(o, bed, say)
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		scenario.step(ctx)
		printStatus(ctx, out, bed)
		select {
		case <-ctx.Done():
			say("atoll-demo: stopping")
			return nil
		case <-t.C:
		}
	}
}
