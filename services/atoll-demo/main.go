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
	"crypto/rand"
	"encoding/hex"
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

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/internal/edgesim"
	"github.com/atoll-edge/atoll/internal/kubetest"
	"github.com/atoll-edge/atoll/internal/sitesim"
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
	dir      string
}

func parse(args []string) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("atoll-demo", flag.ContinueOnError)
	fs.IntVar(&o.units, "units", 2, "number of simulated edge sites (NodeUnits)")
	fs.IntVar(&o.nodes, "nodes", 3, "nodes per site")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until interrupted)")
	fs.DurationVar(&o.interval, "interval", 3*time.Second, "status table refresh period")
	fs.IntVar(&o.hubPort, "hub-port", 4222, "hub client port on 127.0.0.1 (0: random)")
	fs.StringVar(&o.dir, "dir", "", "working directory for logs and state (default: a new temp dir)")
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

	// Kubernetes.
	say("starting etcd, kube-apiserver, kube-controller-manager and kube-scheduler ...")
	start := time.Now()
	cluster, err := kubetest.StartCluster(ctx, kubetest.Config{
		Dir: filepath.Join(o.dir, "kube"), ControllerManager: true, Scheduler: true,
		Logger: log.With("component", "kubetest"),
	})
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	defer cluster.Stop()
	say("kubernetes ready in %v; kubeconfig: %s", time.Since(start).Round(100*time.Millisecond), cluster.KubeconfigPath())

	// The cloud.
	password := randomHex(8)
	cfg := cloudapp.Default()
	cfg.Log.Level = "info"
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.Hub.Host = "127.0.0.1"
	cfg.Hub.ClientPort = freePort(o.hubPort)
	cfg.Hub.LeafPort = -1
	cfg.Hub.StoreDir = filepath.Join(o.dir, "hub")
	cfg.Hub.Operators = map[string]string{"demo": password}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var h *hub.Hub
	cloud := fx.New(cloudapp.Options(cfg, log.With("service", "atoll-cloud")), fx.Populate(&h))
	if err := cloud.Start(ctx); err != nil {
		return fmt.Errorf("atoll-cloud: %w", err)
	}
	defer stopApp(cloud)
	say("atoll-cloud ready: hub %s (user demo, password %s)", h.ClientURL(), password)
	say("  watch events: ATOLL_NATS_URL=%s ATOLL_NATS_USER=demo ATOLL_NATS_PASSWORD=%s go run ./services/atoll events tail", h.ClientURL(), password)

	// The edge.
	kube, err := edgesim.New(cluster.RESTConfig(), edgesim.Config{Logger: log.With("component", "edgesim")})
	if err != nil {
		return err
	}
	if err := kube.Start(ctx); err != nil {
		return err
	}
	defer kube.Stop()
	sites, err := sitesim.New(sitesim.Config{Hub: h, Kube: kube, StateDir: filepath.Join(o.dir, "edge"), Logger: log.With("service", "atoll-edge")})
	if err != nil {
		return err
	}
	defer func() { _ = sites.Close(context.Background()) }()
	for u := range o.units {
		unit := fmt.Sprintf("site-%c", 'a'+u)
		if _, err := sites.AddSite(ctx, unit, o.nodes); err != nil {
			return err
		}
		say("site %s: %d nodes with real atoll-edge agents", unit, o.nodes)
	}

	// Status until interrupted.
	client := cluster.Client()
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		printStatus(ctx, out, client, sites)
		select {
		case <-ctx.Done():
			say("atoll-demo: stopping")
			return nil
		case <-t.C:
		}
	}
}

func stopApp(app *fx.App) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = app.Stop(ctx)
}

// freePort returns port if it can be bound on 127.0.0.1, else -1 (random).
func freePort(port int) int {
	if port <= 0 {
		return -1
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return -1
	}
	_ = ln.Close()
	return port
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
