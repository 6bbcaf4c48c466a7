// Command atoll-soak runs the chaos soak (test/chaos): Atoll installed on
// real nodes (test/podbed: real etcd, kube-apiserver, KCM, scheduler,
// kubelets, containerd, kube-proxy; atoll-cloud and atoll-edge as pods
// from their images), a workload of grids with a client in each unit, and
// a seeded schedule of faults, while a checker of its own process watches
// from the outside and reports every broken invariant.
//
//	atoll-soak [--duration 2h] [--seed N] [--shape embedded|cluster] [--units 6] [--nodes 4] [--dir DIR]
//	atoll-soak --print …   the schedule only
//	atoll-soak check --dir DIR   the checker (run by the soak)
//	atoll-soak report --dir DIR  writes the summary and the report again from DIR/result.json
//
// Run it with `go tool task soak:chaos -- …`. It exits 3 when an
// invariant was broken; the report is DIR/report.html.
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
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/test/chaos"
)

const prog = "atoll-soak"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cliflags.Main(prog, func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if len(args) > 0 && args[0] == "check" {
		return check(ctx, args[1:], out, log)
	}
	if len(args) > 0 && args[0] == "report" {
		return rewriteReport(args[1:], out)
	}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	o := chaos.Options{Logger: log}
	fs.DurationVar(&o.Duration, "duration", 2*time.Hour, "how long the schedule of faults runs")
	seed := fs.Uint64("seed", 0, "the schedule's seed (0: from the clock, printed)")
	fs.StringVar(&o.Shape, "shape", chaos.ShapeEmbedded, "the hub: embedded (in atoll-cloud) or cluster (three servers, two atoll-cloud replicas)")
	fs.IntVar(&o.Units, "units", 6, "edge units (sites)")
	fs.IntVar(&o.Nodes, "nodes", 4, "real nodes per unit")
	fs.IntVar(&o.Net, "net", 10, "the node fleet's network number (10.199.<net>.0/24; another soak or test on this machine needs another)")
	fs.DurationVar(&o.Warmup, "warmup", 2*time.Minute, "how long the installation runs before the first fault")
	fs.StringVar(&o.Dir, "dir", "", "where the run's state, logs and report go (default: a new directory under /tmp)")
	fs.StringVar(&o.Sabotage, "sabotage", "", "break Atoll on purpose once the workload runs, to see the checker catch it: "+chaos.SabotageNoAgents+" (delete every atoll-edge)")
	printOnly := fs.Bool("print", false, "print the schedule and exit")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(out, fs, prog+" [flags] | "+prog+" check --dir DIR")
		}
		return err
	}
	switch {
	case o.Shape != chaos.ShapeEmbedded && o.Shape != chaos.ShapeCluster:
		return cliflags.Usagef("--shape %q: want %s or %s", o.Shape, chaos.ShapeEmbedded, chaos.ShapeCluster)
	case o.Units < 1 || o.Units > 26:
		return cliflags.Usagef("--units %d: want 1 to 26", o.Units)
	case o.Nodes < 3:
		return cliflags.Usagef("--nodes %d: want 3 or more (a node's peers vote on it)", o.Nodes)
	case o.Sabotage != "" && o.Sabotage != chaos.SabotageNoAgents:
		return cliflags.Usagef("--sabotage %q: want %s", o.Sabotage, chaos.SabotageNoAgents)
	case o.Duration < time.Minute:
		return cliflags.Usagef("--duration %s: want a minute or more", o.Duration)
	}
	o.Seed = *seed
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano()%1_000_000) + 1 //nolint:gosec // a positive number up to a million
	}
	if *printOnly {
		fmt.Fprint(out, chaos.MakeSchedule(o.Seed, o.Duration, o.Topo()).String())
		return nil
	}
	if o.Dir == "" {
		o.Dir = filepath.Join(os.TempDir(), fmt.Sprintf("atoll-soak-%d", o.Seed))
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	self, err := os.Executable()
	if err != nil {
		return err
	}
	o.Checker = []string{self, "check", "--dir", o.Dir}
	fmt.Fprintf(out, "chaos soak of %d units of %d real nodes; state and report in %s\n%s",
		o.Units, o.Nodes, o.Dir, chaos.MakeSchedule(o.Seed, o.Duration, o.Topo()))
	r, err := chaos.Soak(ctx, o)
	if r.Schedule.Seed != 0 {
		fmt.Fprint(out, chaos.Summary(r))
		fmt.Fprintf(out, "\nreport: %s\n", filepath.Join(o.Dir, chaos.ReportFile))
	}
	if err != nil && len(r.Violations) > 0 {
		fmt.Fprintln(errOut, err)
		return cliflags.ExitCode{Code: chaos.ExitViolations}
	}
	return err
}

// check runs the checker on a soak's directory until its journal says the
// schedule is done.
func check(ctx context.Context, args []string, out io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet(prog+" check", flag.ContinueOnError)
	dir := fs.String("dir", "", "the soak's directory (its plan.json and journal.jsonl)")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(out, fs, prog+" check --dir DIR")
		}
		return err
	}
	if *dir == "" {
		return cliflags.Usagef("--dir is required")
	}
	c, err := chaos.NewChecker(*dir, log)
	if err != nil {
		return err
	}
	violations, err := c.Run(ctx)
	if err != nil {
		return err
	}
	if len(violations) > 0 {
		return cliflags.ExitCode{Code: chaos.ExitViolations}
	}
	return nil
}

// rewriteReport writes a finished soak's summary and report again from
// its result.json.
func rewriteReport(args []string, out io.Writer) error {
	fs := flag.NewFlagSet(prog+" report", flag.ContinueOnError)
	dir := fs.String("dir", "", "the soak's directory (its result.json)")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(out, fs, prog+" report --dir DIR")
		}
		return err
	}
	if *dir == "" {
		return cliflags.Usagef("--dir is required")
	}
	r, err := chaos.ReadResult(*dir)
	if err != nil {
		return err
	}
	if err := chaos.WriteResult(*dir, r); err != nil {
		return err
	}
	fmt.Fprintln(out, filepath.Join(*dir, chaos.ReportFile))
	return nil
}
