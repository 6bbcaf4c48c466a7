// Command atoll-edge runs on every edge node: it embeds the node's NATS
// server (meshed with its unit, leaf-linked to the hub) and the edge
// components. It holds no Kubernetes credentials.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/logging"
)

const prog = "atoll-edge"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cliflags.Main(prog, func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// run parses args, validates the configuration and runs the agent until
// ctx is done (SIGINT or SIGTERM). A wrong command line is a
// cliflags.UsageError; a failed start is one line naming its cause.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, prog+" --node-name NAME --hub-url nats-leaf://HOST:7422 [flags]   (every flag also reads $ATOLL_<FLAG>, e.g. ATOLL_HUB_URL)")
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("unexpected argument %q (atoll-edge takes only flags)", fs.Arg(0))
	}
	if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
		return cliflags.Usage(err)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		return cliflags.Usage(err)
	}
	log, err := logging.New(cfg.Log, stderr)
	if err != nil {
		return cliflags.Usage(err)
	}
	return fxrun.Run(ctx, edgeapp.Options(cfg, log))
}
