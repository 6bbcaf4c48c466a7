// Command atoll-cloud runs Atoll's cloud side: the NATS hub with JetStream
// and the cloud services that turn edge events into Kubernetes writes.
package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/logging"
)

func main() {
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet("atoll-cloud", flag.ExitOnError)
	cfg.RegisterFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := setup(fs, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-cloud:", err)
		os.Exit(2)
	}
	log, err := logging.New(cfg.Log, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "atoll-cloud:", err)
		os.Exit(2)
	}
	// Run starts the app, blocks until SIGINT or SIGTERM, then stops it
	// gracefully; a failed start exits non-zero.
	fx.New(cloudapp.Options(cfg, log)).Run()
}

func setup(fs *flag.FlagSet, cfg *cloudapp.Config) error {
	if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
		return err
	}
	if err := cfg.Load(); err != nil {
		return err
	}
	return cfg.Validate()
}
