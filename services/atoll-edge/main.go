// Command atoll-edge runs on every edge node: it embeds the node's NATS
// server (meshed with its unit, leaf-linked to the hub) and the edge
// components. It holds no Kubernetes credentials.
//
// `atoll-edge local-api` is the node's local API endpoint (edge/localapi):
// run before the kubelet (a systemd unit), it serves the Kubernetes API to
// the node's own components with the node's credentials and answers them
// from what they read while kube-apiserver is unreachable.
package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/localapi"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/logging"
	"github.com/atoll-edge/atoll/internal/memlimit"
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
	if len(args) > 0 && args[0] == "local-api" {
		return localAPI(ctx, args[1:], stdout, stderr)
	}
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
	memlimit.FromContainer(ctx, log)
	return fxrun.Run(ctx, edgeapp.Options(cfg, log))
}

// localAPIFlags are the flags of `atoll-edge local-api`, bound to the
// configurations they set.
func localAPIFlags() (*flag.FlagSet, *localapi.Config, *admin.Config, *logging.Config) {
	fs := flag.NewFlagSet(prog+" local-api", flag.ContinueOnError)
	cfg := localapi.Default()
	cfg.RegisterFlags(fs)
	adminCfg := admin.Config{Addr: "127.0.0.1:10262"}
	adminCfg.RegisterFlags(fs)
	logCfg := logging.Default()
	fs.StringVar(&logCfg.Level, "log-level", logCfg.Level, "log level: debug, info, warn, error")
	fs.StringVar(&logCfg.Format, "log-format", logCfg.Format, "log format: json or text")
	return fs, &cfg, &adminCfg, &logCfg
}

// localAPI runs the node's local API endpoint until ctx is done.
func localAPI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = prog + " local-api --apiserver https://HOST:6443 --ca-file F --client-cert F --client-key F [flags]   (every flag also reads $ATOLL_<FLAG>, e.g. ATOLL_APISERVER)"
	fs, cfg, adminCfg, logCfg := localAPIFlags()
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, usage)
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("local-api: unexpected argument %q", fs.Arg(0))
	}
	if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
		return cliflags.Usage(err)
	}
	if err := cfg.Validate(); err != nil {
		return cliflags.Usage(err)
	}
	log, err := logging.New(*logCfg, stderr)
	if err != nil {
		return cliflags.Usage(err)
	}
	log = log.With("component", "local-api")
	adm, err := admin.New(*adminCfg, log)
	if err != nil {
		return cliflags.Usage(err)
	}
	srv, err := localapi.New(*cfg, adm.Registerer(), log)
	if err != nil {
		return err
	}
	if err := adm.Start(ctx); err != nil {
		return err
	}
	defer func() {
		stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = adm.Stop(stop)
	}()
	log.Info("local API: serving the node's components", "listen", srv.Addr(), "apiserver", cfg.APIServer, "dir", cfg.Dir)
	return srv.Run(ctx)
}
