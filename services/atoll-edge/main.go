// Command atoll-edge runs on every edge node: it embeds the node's NATS
// server (meshed with its unit, leaf-linked to the hub) and the edge
// components. It holds no Kubernetes credentials.
package main

import (
	"flag"
	"fmt"
	"os"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/logging"
)

func main() {
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet("atoll-edge", flag.ExitOnError)
	cfg.RegisterFlags(fs)
	_ = fs.Parse(os.Args[1:])
	if err := cliflags.FromEnv(fs, "ATOLL_"); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-edge:", err)
		os.Exit(2)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "atoll-edge:", err)
		os.Exit(2)
	}
	log, err := logging.New(cfg.Log, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "atoll-edge:", err)
		os.Exit(2)
	}
	fx.New(edgeapp.Options(cfg, log)).Run()
}
