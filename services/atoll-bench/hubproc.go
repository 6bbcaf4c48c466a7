package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/internal/memlimit"
	"github.com/atoll-edge/atoll/test/natstest"
)

// The hub shapes --scale-hub measures.
const (
	hubEmbedded = "embedded" // in atoll-cloud's process (overlays/embedded-hub)
	hubExternal = "external" // a stock nats-server of its own (overlays/external-nats)
)

// externalManifest is the overlay whose hub server the external shape
// runs (read from the repository root, where the benchmark runs).
const externalManifest = "deploy/overlays/external-nats/hub-external.yaml"

// buildNATSServer builds the stock nats-server of the module Atoll pins
// into dir.
func buildNATSServer(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "nats-server")
	if b, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build nats-server (run from the repository root): %w: %s", err, b)
	}
	return bin, nil
}

// hubProcess is the external-nats overlay's hub as one server: stock
// nats-server with the overlay's nats.conf (alone, on loopback), trusting
// the identity keys atoll-cloud is given, in a memory cgroup of the
// overlay's limit with the overlay's GOMEMLIMIT.
type hubProcess struct {
	cmd    *exec.Cmd
	exited chan error
	cg     *memoryCgroup
	start  func() error
	log    string
	// profPort serves the server's /debug/pprof (nats-server's
	// prof_port), 0 when not asked for.
	profPort int
}

// startExternalHub writes the server's configuration into hubDir (the
// identity keys into identityDir), starts it and waits until JetStream
// is up. With profile, the server also serves /debug/pprof (prof_port).
func startExternalHub(ctx context.Context, bin, hubDir, identityDir, leafCert, leafKey string, clientPort, leafPort int, memLimit int64, profile bool) (*hubProcess, error) {
	_, trust, err := identity.Setup(identityDir)
	if err != nil {
		return nil, err
	}
	httpPort, err := natstest.FreePort()
	if err != nil {
		return nil, err
	}
	conf, err := natstest.WriteExternalHub(externalManifest, hubDir, trust,
		natstest.ExternalHubPorts{Client: clientPort, Leaf: leafPort, HTTP: httpPort}, leafCert, leafKey)
	if err != nil {
		return nil, err
	}
	profPort := 0
	if profile {
		if profPort, err = natstest.FreePort(); err != nil {
			return nil, err
		}
		if err := appendFile(conf, fmt.Sprintf("\nprof_port: %d\n", profPort)); err != nil {
			return nil, err
		}
	}
	cg, err := newMemoryCgroup(memLimit)
	if err != nil {
		return nil, err
	}
	h := &hubProcess{cg: cg, log: filepath.Join(hubDir, "nats-server.log"), profPort: profPort}
	h.start = func() error {
		logf, err := os.OpenFile(h.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return err
		}
		defer logf.Close()
		h.cmd = exec.CommandContext(ctx, bin, "-c", conf)
		cg.command(h.cmd)
		// The overlay's environment: the server's name, and GOMEMLIMIT at
		// 90 % of its memory limit (stock nats-server does not read the
		// cgroup).
		h.cmd.Env = append(os.Environ(), "POD_NAME=atoll-hub-0")
		if memLimit > 0 {
			h.cmd.Env = append(h.cmd.Env, fmt.Sprintf("GOMEMLIMIT=%d", int64(float64(memLimit)*memlimit.Ratio)))
		}
		h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		h.cmd.Stdout, h.cmd.Stderr = logf, logf
		if err := h.cmd.Start(); err != nil {
			return err
		}
		h.exited = make(chan error, 1)
		go func(c *exec.Cmd, e chan<- error) { e <- c.Wait() }(h.cmd, h.exited)
		if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/healthz?js-enabled-only=true", httpPort), 2*time.Minute); err != nil {
			return fmt.Errorf("hub server not ready (see %s): %w", h.log, err)
		}
		return nil
	}
	if err := h.start(); err != nil {
		h.stop()
		return nil, err
	}
	return h, nil
}

func (h *hubProcess) pid() int { return h.cmd.Process.Pid }

// died says whether the server ended before the benchmark ended it.
func (h *hubProcess) died() error {
	select {
	case err := <-h.exited:
		h.exited <- err
		return fmt.Errorf("the hub server exited during the run (%w; %s; see %s)", err, h.cg.ooms(), h.log)
	default:
		return nil
	}
}

// kill kills the server (SIGKILL) and waits for it.
func (h *hubProcess) kill() error {
	if err := h.cmd.Process.Kill(); err != nil {
		return err
	}
	err := <-h.exited
	h.exited <- err
	return nil
}

// restart starts the server again on the same store; it returns its pid.
func (h *hubProcess) restart() (int, error) {
	if err := h.start(); err != nil {
		return 0, err
	}
	return h.pid(), nil
}

// stop stops the server (SIGTERM, then SIGKILL after 30 s) and removes
// its cgroup.
func (h *hubProcess) stop() {
	defer h.cg.remove()
	if h.cmd == nil || h.cmd.Process == nil {
		return
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	// How it ended stays in exited, for died.
	select {
	case err := <-h.exited:
		h.exited <- err
	case <-time.After(30 * time.Second):
		_ = h.cmd.Process.Kill()
		err := <-h.exited
		h.exited <- err
	}
}

// appendFile appends text to the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
