// Package tunnel is the edge end of the cloud-to-edge tunnel: it accepts
// the sessions the cloud opens for this node (internal/tunnelproto) and relays
// each to a local target, but only to an allow-listed one — the kubelet
// and configured ports. Anything else is refused with an ERROR frame that
// names the target, and counted.
//
// It also relays the sessions of its unit peers whose own leaf link is
// down (internal/tunnelproto Relay): only to a current member of its unit.
package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// Agent serves one node's tunnel sessions.
type Agent struct {
	cfg     Config
	node    string
	log     *slog.Logger
	metrics *Metrics
	// allow maps a port the cloud may ask for to the local address dialled.
	allow map[int]string
	ln    *tunnelproto.Listener
	// apiServer forwards the node's connections to kube-apiserver
	// through the hub (Config.APIServerListen); nil: none.
	apiServer *apiServerForward
	relay     *tunnelproto.Relay
	units     Units
	wg        sync.WaitGroup
	dial      func(ctx context.Context, addr string) (net.Conn, error)
}

// Units is the agent's view of its unit (edge/membership).
type Units interface {
	// Unit is this node's unit ("" while in none) and whether node is
	// one of its members now.
	Member(node string) (unit string, ok bool)
}

// SetUnits has the agent relay its unit peers' sessions (when
// Config.Relay) by units; call it before Start.
func (a *Agent) SetUnits(u Units) { a.units = u }

// New builds an agent for node; m may be nil.
func New(cfg Config, node string, m *Metrics, log *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, node: node, log: log, metrics: m, allow: map[int]string{}}
	for _, t := range append([]string{cfg.Kubelet}, cfg.Allow...) {
		_, port, _ := splitPort(t)
		a.allow[port] = t
	}
	var d net.Dialer
	a.dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	return a, nil
}

// Target maps a requested "host:port" to the local address to dial: the
// allow-listed address with that port, whatever host the cloud named (the
// apiserver names the node's InternalIP; the agent dials where the kubelet
// listens).
func (a *Agent) Target(requested string) (string, error) {
	_, port, err := splitPort(requested)
	if err != nil {
		return "", fmt.Errorf("target %q: %w", requested, err)
	}
	addr, ok := a.allow[port]
	if !ok {
		return "", fmt.Errorf("target %q not allowed on node %s (allowed ports: %s)", requested, a.node, a.ports())
	}
	return addr, nil
}

func (a *Agent) ports() string {
	s := ""
	for p := range a.allow {
		if s != "" {
			s += ","
		}
		s += strconv.Itoa(p)
	}
	return s
}

// Start subscribes to the node's sessions on nc.
func (a *Agent) Start(nc *nats.Conn) error {
	ln, err := tunnelproto.Listen(nc, a.node, a.cfg.Session, a.cfg.Backlog)
	if err != nil {
		return fmt.Errorf("tunnel agent: %w", err)
	}
	ln.OnDone = func(st tunnelproto.Stats, err error) { a.metrics.done(st, err) }
	ln.OnRelayedFrame = func() { a.metrics.relayedIn() }
	a.ln = ln
	if a.cfg.Relay && a.units != nil {
		r, err := tunnelproto.NewRelay(nc, a.node, tunnelproto.RelayConfig{
			Member:  a.units.Member,
			Expiry:  a.cfg.Session.Defaults().LinkTimeout,
			OnFrame: a.metrics.relayFrame,
			OnRefused: func(node, reason string) {
				a.metrics.relayRefused()
				a.log.Warn("tunnel relay refused", "node", node, "reason", reason)
			},
		})
		if err != nil {
			_ = ln.Close()
			return fmt.Errorf("tunnel agent: %w", err)
		}
		a.relay = r
		a.metrics.relaySessions(r.Sessions)
	}
	if a.cfg.APIServerListen != "" {
		if err := a.startAPIServerForward(nc); err != nil {
			_ = ln.Close()
			if a.relay != nil {
				_ = a.relay.Close()
			}
			return err
		}
	}
	return nil
}

// Run accepts sessions (and, with Config.APIServerListen, connections to
// forward to kube-apiserver) until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	if a.apiServer != nil {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.apiServer.serve(ctx)
		}()
	}
	for {
		r, err := a.ln.Accept(ctx)
		if err != nil {
			if errors.Is(err, tunnelproto.ErrListenerClosed) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		if token, ok := apiServerToken(r.Target); ok {
			if a.apiServer == nil || !a.apiServer.take(token, r) {
				a.metrics.refused()
				r.Refuse(fmt.Sprintf("no connection to kube-apiserver waits on node %s for this session", a.node))
			}
			continue
		}
		addr, err := a.Target(r.Target)
		if err != nil {
			a.metrics.refused()
			a.log.Warn("tunnel target refused", "target", r.Target, "err", err)
			r.Refuse(err.Error())
			continue
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.serve(ctx, r, addr)
		}()
	}
}

func (a *Agent) serve(ctx context.Context, r *tunnelproto.Request, addr string) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := a.dial(dctx, addr)
	if err != nil {
		a.metrics.dialFailed()
		r.Refuse(fmt.Sprintf("dial %s on node %s: %v", addr, a.node, err))
		return
	}
	a.metrics.relaying(1)
	defer a.metrics.relaying(-1)
	tc := r.Accept()
	stop := context.AfterFunc(ctx, func() { tc.Abort("agent shutting down"); _ = c.Close() })
	defer stop()
	tunnelproto.Pipe(tc, c)
	if err := tc.Err(); err != nil {
		// The target saw a reset (tunnelproto.Pipe), not an end.
		a.log.Warn("tunnel session failed", "target", addr, "session", tc.Session(), "err", err)
	}
}

// Stop refuses new sessions, aborts live ones and waits for their relays.
func (a *Agent) Stop(ctx context.Context) error {
	if a.ln == nil {
		return nil
	}
	err := a.ln.Close()
	if a.apiServer != nil {
		_ = a.apiServer.ln.Close()
	}
	if a.relay != nil {
		err = errors.Join(err, a.relay.Close())
	}
	done := make(chan struct{})
	go func() { a.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	return err
}
