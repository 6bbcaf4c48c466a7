// Command atoll-cloud runs Atoll's cloud side: the NATS hub with JetStream
// and the cloud services that turn edge events into Kubernetes writes.
// `atoll-cloud hub-trust` prints the configuration an external hub's
// servers need to trust its identity keys; `atoll-cloud operator-creds`
// issues an operator's credentials with them; `atoll-cloud
// hub-leaf-reloader` runs beside an external hub server and makes it
// reload the generated leaf certificate when it changes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/hubtls"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/logging"
	"github.com/atoll-edge/atoll/internal/memlimit"
)

const prog = "atoll-cloud"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cliflags.Main(prog, func() error { return run(ctx, os.Args[1:], os.Stdout, os.Stderr) })
}

// run parses args, validates the configuration and runs the app until ctx
// is done (SIGINT or SIGTERM). A wrong command line is a
// cliflags.UsageError; a failed start is one line naming its cause.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "hub-trust" {
		return hubTrust(args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "operator-creds" {
		return operatorCreds(args[1:], stdout)
	}
	if len(args) > 0 && args[0] == "hub-leaf-reloader" {
		return hubLeafReloader(ctx, args[1:], stdout, stderr)
	}
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, prog+" [flags]   (every flag also reads $ATOLL_<FLAG>, e.g. ATOLL_HUB_URL)")
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("unexpected argument %q (atoll-cloud takes only flags)", fs.Arg(0))
	}
	if err := setup(fs, &cfg); err != nil {
		return cliflags.Usage(err)
	}
	log, err := logging.New(cfg.Log, stderr)
	if err != nil {
		return cliflags.Usage(err)
	}
	memlimit.FromContainer(ctx, log)
	return fxrun.Run(ctx, cloudapp.Options(cfg, log))
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

// hubTrust prints the configuration a stock nats-server of an external hub
// needs to trust atoll-cloud's identity (operator mode, full resolver),
// creating the identity keys in --identity-dir on first use.
func hubTrust(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(prog+" hub-trust", flag.ContinueOnError)
	dir := fs.String("identity-dir", "identity", "directory of the identity keys (created when empty); give it to atoll-cloud as --identity-dir")
	resolver := fs.String("resolver-dir", "/data/jwt", "the servers' resolver directory (writable, persistent)")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, prog+" hub-trust [--identity-dir D] [--resolver-dir R] > trust.conf")
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("hub-trust: unexpected argument %q", fs.Arg(0))
	}
	_, trust, err := identity.Setup(*dir)
	if err != nil {
		return err
	}
	_, err = io.WriteString(stdout, "# atoll-cloud hub-trust: include this in every hub server's nats.conf\n"+trust.ServerConfig(*resolver))
	return err
}

// operatorCreds prints the credentials file of a human operator (what
// atoll status, atoll node enroll and the nats CLI log in with), issued
// with the identity keys of --identity-dir, which must exist: run it where
// atoll-cloud runs (kubectl exec).
func operatorCreds(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet(prog+" operator-creds", flag.ContinueOnError)
	dir := fs.String("identity-dir", "identity", "directory of atoll-cloud's identity keys (its --identity-dir)")
	name := fs.String("name", "operator", "the operator's name, shown in the hub's connection list")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime of the credentials (0: no expiry)")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, prog+" operator-creds [--identity-dir D] [--name N] [--ttl 24h] > operator.creds")
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("operator-creds: unexpected argument %q", fs.Arg(0))
	}
	if *ttl < 0 {
		return cliflags.Usagef("operator-creds: --ttl %s is negative", *ttl)
	}
	keys, err := identity.LoadKeys(*dir)
	if err != nil {
		return fmt.Errorf("operator-creds: %w (give atoll-cloud's --identity-dir)", err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		return err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return err
	}
	userJWT, err := identity.NewIssuer(keys, hublink.DefaultDomain).Operator(*name, pub, *ttl)
	if err != nil {
		return err
	}
	creds, err := identity.FormatCreds(userJWT, kp)
	if err != nil {
		return err
	}
	_, err = stdout.Write(creds)
	return err
}

// hubLeafReloader signals an external hub server (SIGHUP, by its pid
// file) whenever its leaf certificate files change, until ctx is done.
func hubLeafReloader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(prog+" hub-leaf-reloader", flag.ContinueOnError)
	r := hubtls.Reloader{}
	fs.StringVar(&r.CertFile, "cert", "/etc/nats/leaf-tls/tls.crt", "the server's leaf certificate (a key of the Secret "+hubtls.DefaultSecret+")")
	fs.StringVar(&r.KeyFile, "key", "/etc/nats/leaf-tls/tls.key", "the certificate's key")
	fs.StringVar(&r.PIDFile, "pid-file", "/var/run/nats/nats.pid", "the server's pid_file")
	fs.DurationVar(&r.Interval, "interval", 10*time.Second, "how often the files are read")
	if err := cliflags.Parse(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			cliflags.PrintUsage(stdout, fs, prog+" hub-leaf-reloader [--cert F] [--key F] [--pid-file F] [--interval D]")
		}
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("hub-leaf-reloader: unexpected argument %q", fs.Arg(0))
	}
	if err := r.Validate(); err != nil {
		return cliflags.Usage(err)
	}
	log, err := logging.New(logging.Default(), stderr)
	if err != nil {
		return err
	}
	r.Log = log.With("component", "hub-leaf-reloader")
	return r.Run(ctx)
}
