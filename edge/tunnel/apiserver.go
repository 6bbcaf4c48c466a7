package tunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// apiServerForward is the node's way to kube-apiserver through the hub:
// each connection accepted on Config.APIServerListen (the local API
// endpoint's, with --apiserver-via=hub) asks atoll-cloud for a connection
// (APIServerDial, on the node's own leaf link), takes the session the
// answering replica opens for its token and relays the bytes. TLS runs
// end to end between the endpoint and kube-apiserver.
type apiServerForward struct {
	a  *Agent
	nc *nats.Conn
	ln net.Listener

	mu      sync.Mutex
	waiting map[string]chan *tunnelproto.Conn // by token
}

func (a *Agent) startAPIServerForward(nc *nats.Conn) error {
	ln, err := net.Listen("tcp", a.cfg.APIServerListen)
	if err != nil {
		return fmt.Errorf("tunnel agent: apiserver listener: %w", err)
	}
	a.apiServer = &apiServerForward{a: a, nc: nc, ln: ln, waiting: map[string]chan *tunnelproto.Conn{}}
	a.log.Info("forwarding connections to kube-apiserver through the hub", "listen", ln.Addr().String())
	return nil
}

// APIServerAddr is where the forward listens (nil when it does not).
func (a *Agent) APIServerAddr() net.Addr {
	if a.apiServer == nil {
		return nil
	}
	return a.apiServer.ln.Addr()
}

func (f *apiServerForward) serve(ctx context.Context) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.a.wg.Add(1)
		go func() {
			defer f.a.wg.Done()
			f.forward(ctx, c)
		}()
	}
}

// take hands the session for token to the connection waiting for it;
// false when none waits (it gave up, or the cloud never was asked).
func (f *apiServerForward) take(token string, r *tunnelproto.Request) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch, ok := f.waiting[token]
	if ok {
		delete(f.waiting, token)
		ch <- r.Accept() // buffered: never blocks
	}
	return ok
}

func (f *apiServerForward) forward(ctx context.Context, c net.Conn) {
	a := f.a
	token := tunnelproto.NewSessionID()
	ch := make(chan *tunnelproto.Conn, 1)
	f.mu.Lock()
	f.waiting[token] = ch
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.waiting, token)
		select {
		case tc := <-ch: // arrived after the wait ended
			tc.Abort("the connection to kube-apiserver gave up waiting")
		default:
		}
		f.mu.Unlock()
	}()
	tc, err := f.dial(ctx, token, ch)
	if err != nil {
		a.metrics.apiServer(err)
		a.log.Warn("no connection to kube-apiserver through the hub", "err", err)
		_ = c.Close()
		return
	}
	a.metrics.apiServer(nil)
	a.metrics.relaying(1)
	defer a.metrics.relaying(-1)
	stop := context.AfterFunc(ctx, func() { tc.Abort("agent shutting down"); _ = c.Close() })
	defer stop()
	tunnelproto.Pipe(c, tc)
}

// errNoRelay names what an operator has to do when no replica answers.
var errNoRelay = errors.New("no atoll-cloud replica relays connections to kube-apiserver (start atoll-cloud with --tunnel-apiserver)")

func (f *apiServerForward) dial(ctx context.Context, token string, ch chan *tunnelproto.Conn) (*tunnelproto.Conn, error) {
	subj, err := events.APIServerDialSubject(f.a.node)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, f.a.cfg.APIServerTimeout)
	defer cancel()
	var reply atollv1.APIServerDialed
	err = events.Request(rctx, f.nc, subj, &atollv1.APIServerDial{Node: f.a.node, Token: token}, &reply)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil, errNoRelay
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("atoll-cloud did not answer in %s (is the node's leaf link up?)", f.a.cfg.APIServerTimeout)
	case err != nil:
		return nil, err
	}
	// The replica answers once the session is established, so the
	// session is here; a short wait covers the handover only.
	select {
	case tc := <-ch:
		return tc, nil
	case <-time.After(time.Second):
		return nil, fmt.Errorf("atoll-cloud answered for session %s, which never reached this agent", reply.GetSession())
	}
}

// apiServerToken is the token of a session target "kube-apiserver/<token>".
func apiServerToken(target string) (string, bool) {
	return strings.CutPrefix(target, tunnelproto.APIServerTarget)
}
