// Package tunnel is the cloud end of the cloud-to-edge tunnel: an HTTP
// CONNECT listener (what kube-apiserver's egress selector dials for every
// connection to a kubelet) and TCP port forwards, each connection relayed
// as a session (internal/tunnelproto) to the node's agent over the hub. A replica
// keeps no state beyond the sessions it holds, so any number of equal
// replicas serve any node.
package tunnel

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tlsreload"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// Resolver names the node a CONNECT host (a node name or an address of
// the node) belongs to.
type Resolver interface {
	NodeFor(host string) (node string, ok bool)
}

// Names resolves a host that is itself a valid node name.
type Names struct{}

// NodeFor implements Resolver.
func (Names) NodeFor(host string) (string, bool) { return host, events.ValidName(host) == nil }

// Server is one tunnel server replica.
type Server struct {
	cfg     Config
	res     Resolver
	log     *slog.Logger
	metrics *Metrics
	dialer  *tunnelproto.Dialer
	peers   Peers             // nil: no relaying
	links   LinkState         // nil: link state unknown
	tls     *tlsreload.Server // nil: plain CONNECT
	byNode  nodeSessions

	mu        sync.Mutex
	listeners []net.Listener
	http      *http.Server
	apiServer *apiServerRelay // nil: no --tunnel-apiserver
	wg        sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc
}

// New builds a server; m may be nil.
func New(cfg Config, res Resolver, m *Metrics, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, res: res, log: log, metrics: m}
	if cfg.ConnectTLS.Enabled() {
		var err error
		if s.tls, err = tlsreload.New(tlsreload.Files(cfg.ConnectTLS), names, tls.RequireAndVerifyClientCert, log); err != nil {
			return nil, err
		}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// SetRelay has the server relay sessions through peers (when
// Config.Relay), moving them at once when links reports a node's link
// down (links may be nil); call it before Start.
func (s *Server) SetRelay(peers Peers, links LinkState) { s.peers, s.links = peers, links }

// ErrUnreachable is Dial's error when the hub reported the node's leaf
// link closed and no peer of its unit has a link to relay through: a
// session cannot start, and Dial says so at once instead of after
// DialTimeout.
var ErrUnreachable = errors.New("unreachable")

// Dial opens a session to target on node (for other cloud components).
func (s *Server) Dial(ctx context.Context, node, target string) (net.Conn, error) {
	if s.links != nil && s.links.Down(node) && !s.relayable(node) {
		s.metrics.unreachable()
		return nil, fmt.Errorf("tunnel dial %s %s: %w: the node's link to the hub is down and no unit peer is linked to relay", node, target, ErrUnreachable)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	defer cancel()
	c, err := s.dialer.Dial(ctx, node, target)
	if err != nil {
		s.metrics.failed(err)
		return nil, err
	}
	s.metrics.opened()
	return c, nil
}

// relayable reports whether a peer of node's unit whose own link is not
// known down may relay its sessions.
func (s *Server) relayable(node string) bool {
	if !s.cfg.Relay || s.peers == nil {
		return false
	}
	for _, p := range s.peers.Peers(node) {
		if !s.links.Down(p) {
			return true
		}
	}
	return false
}

func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

// Start listens (synchronously) and serves in the background over nc.
func (s *Server) Start(nc *nats.Conn) error {
	d, err := tunnelproto.NewDialer(nc, s.cfg.Session)
	if err != nil {
		return err
	}
	defer func() {
		if s.dialer == nil {
			_ = d.Close()
		}
	}()
	d.OnDone = func(_ string, st tunnelproto.Stats, err error) { s.metrics.done(st, err) }
	if s.cfg.Relay && s.peers != nil {
		d.Relay = tunnelproto.RelayPolicy{
			Peers: s.peers.Peers,
			After: s.cfg.RelayAfter,
			OnSwitch: func(node, via string) {
				s.metrics.switched(via)
				s.log.Info("tunnel session path", "node", node, "via", via)
			},
			OnRelayed: func(string) { s.metrics.relayed() },
			OnFrame:   s.metrics.relayFrame,
		}
		if s.links != nil {
			d.Relay.Down = s.links.Down
		}
	}
	s.dialer = d
	if s.cfg.ConnectAddr != "" {
		ln, err := listen(s.cfg.ConnectAddr)
		if err != nil {
			return fmt.Errorf("tunnel: listen %s: %w", s.cfg.ConnectAddr, err)
		}
		s.listeners = append(s.listeners, ln)
		if s.tls != nil {
			ln = s.tls.Listener(ln)
		}
		s.http = &http.Server{Handler: http.HandlerFunc(s.connect), ReadHeaderTimeout: 10 * time.Second}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.log.Error("tunnel CONNECT listener", "err", err)
			}
		}()
	}
	if s.cfg.APIServer != "" {
		if err := s.startAPIServer(nc); err != nil {
			s.closeListeners()
			return err
		}
	}
	for _, f := range s.cfg.Forwards {
		ln, err := listen(f.Listen)
		if err != nil {
			s.closeListeners()
			return fmt.Errorf("tunnel: forward %s: %w", f.Listen, err)
		}
		s.listeners = append(s.listeners, ln)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.forward(ln, f)
		}()
	}
	return nil
}

// Addrs are the listeners' addresses (CONNECT first when configured).
func (s *Server) Addrs() []net.Addr {
	var out []net.Addr
	for _, l := range s.listeners {
		out = append(out, l.Addr())
	}
	return out
}

// hold counts one more connection being served, for Stop to wait for
// (s.wg.Done when it ends); false once the server is stopping.
func (s *Server) hold() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return false
	}
	s.wg.Add(1)
	return true
}

// connect serves one CONNECT request: resolve the node, open a session,
// answer 200 and relay, or answer 502 with the agent's reason.
func (s *Server) connect(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodConnect {
		http.Error(w, "tunnel: only CONNECT", http.StatusMethodNotAllowed)
		return
	}
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		http.Error(w, "tunnel: CONNECT target "+r.Host+": "+err.Error(), http.StatusBadRequest)
		return
	}
	node, ok := s.res.NodeFor(host)
	if !ok {
		s.metrics.unknownNode()
		http.Error(w, "tunnel: no edge node for "+host, http.StatusNotFound)
		return
	}
	c, err := s.Dial(r.Context(), node, net.JoinHostPort(host, port))
	if err != nil {
		s.log.Warn("tunnel session refused", "node", node, "target", r.Host, "err", err)
		status := http.StatusBadGateway
		if errors.Is(err, ErrUnreachable) {
			status = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), status)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		c.Close()
		http.Error(w, "tunnel: no hijacking", http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusOK)
	raw, buf, err := hj.Hijack()
	if err != nil {
		c.Close()
		return
	}
	s.relay(&bufferedConn{Conn: raw, r: buf.Reader}, c)
}

// bufferedConn reads what the HTTP server buffered first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// NetConn is the connection under the buffer (tunnelproto.Break resets it).
func (b *bufferedConn) NetConn() net.Conn { return b.Conn }

// CloseWrite passes a half-close to the TCP connection.
func (b *bufferedConn) CloseWrite() error {
	if cw, ok := b.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return b.Conn.Close()
}

func (s *Server) forward(ln net.Listener, f Forward) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			tc, err := s.Dial(s.ctx, f.Node, f.Target)
			if err != nil {
				s.log.Warn("tunnel forward refused", "listen", f.Listen, "node", f.Node, "target", f.Target, "err", err)
				c.Close()
				return
			}
			s.relay(c, tc)
		}()
	}
}

func (s *Server) relay(c net.Conn, tc net.Conn) {
	if !s.hold() {
		c.Close()
		tc.Close()
		return
	}
	defer s.wg.Done()
	if a, ok := tc.RemoteAddr().(tunnelproto.Addr); ok {
		s.byNode.add(a.Node, 1)
		defer s.byNode.add(a.Node, -1)
	}
	stop := context.AfterFunc(s.ctx, func() { tc.(*tunnelproto.Conn).Abort("tunnel server shutting down"); c.Close() })
	defer stop()
	tunnelproto.Pipe(c, tc)
	s.metrics.closed()
	if err := tc.(*tunnelproto.Conn).Err(); err != nil {
		// The client saw a reset (tunnelproto.Pipe), not an end.
		a, _ := tc.RemoteAddr().(tunnelproto.Addr)
		s.log.Warn("tunnel session failed", "node", a.Node, "target", a.Target, "session", tc.(*tunnelproto.Conn).Session(), "err", err)
	}
}

func (s *Server) closeListeners() {
	for _, l := range s.listeners {
		_ = l.Close()
	}
}

// Stop closes the listeners, aborts live sessions (the agents learn at
// once) and waits for the relays.
func (s *Server) Stop(ctx context.Context) error {
	if s.http != nil {
		_ = s.http.Close()
	}
	s.closeListeners()
	s.apiServer.stop()
	if s.dialer != nil {
		_ = s.dialer.Close()
	}
	s.mu.Lock()
	s.cancel()
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
