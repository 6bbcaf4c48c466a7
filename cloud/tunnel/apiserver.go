package tunnel

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// apiServerRelay answers nodes' APIServerDial requests (the nodes' local
// API endpoints with --apiserver-via=hub): it dials kube-apiserver, opens
// a session to the node's agent for the request's token and relays the
// bytes. TLS runs end to end between the node and kube-apiserver, so this
// replica never holds or reads a node's credentials; kube-apiserver
// authenticates the node by its client certificate.
type apiServerRelay struct {
	s   *Server
	svc micro.Service

	mu     sync.Mutex
	byNode map[string]int // connections per node, at most cfg.APIServerPerNode
}

// startAPIServer adds this replica to the TunnelService queue group.
func (s *Server) startAPIServer(nc *nats.Conn) error {
	r := &apiServerRelay{s: s, byNode: map[string]int{}}
	f := events.APIServerDialFamily
	svc, err := micro.AddService(nc, micro.Config{
		Name:        events.TunnelService,
		Version:     events.CloudServiceVersion,
		Description: "atoll-cloud: nodes' connections to kube-apiserver through the hub",
		QueueGroup:  events.TunnelService,
	})
	if err != nil {
		return fmt.Errorf("tunnel: add service %s: %w", events.TunnelService, err)
	}
	err = svc.AddEndpoint(f.Endpoint, micro.HandlerFunc(r.handle),
		micro.WithEndpointSubject(f.Wildcard()),
		micro.WithEndpointMetadata(map[string]string{
			"request": events.TypeName(f.Message), "reply": events.TypeName(f.Reply),
		}))
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		_ = svc.Stop()
		return fmt.Errorf("tunnel: endpoint %s on %s: %w", f.Endpoint, f.Wildcard(), err)
	}
	r.svc = svc
	s.apiServer = r
	s.log.Info("relaying nodes' connections to kube-apiserver", "apiserver", s.cfg.APIServer, "subject", f.Wildcard())
	return nil
}

func (r *apiServerRelay) stop() {
	if r != nil {
		_ = r.svc.Stop()
	}
}

// handle checks the request and serves it in the background: opening the
// session takes a round trip to the node, and the endpoint's subscription
// must not wait for it.
func (r *apiServerRelay) handle(req micro.Request) {
	var dial atollv1.APIServerDial
	msg := &nats.Msg{Subject: req.Subject(), Header: nats.Header(req.Headers()), Data: req.Data()}
	node, err := events.ParseAPIServerDialSubject(req.Subject())
	if err == nil {
		err = events.DecodeMsg(msg, &dial) // also: the payload names the subject's node
	}
	if err == nil && (dial.GetToken() == "" || len(dial.GetToken()) > 64) {
		err = fmt.Errorf("token of %d bytes: want 1 to 64", len(dial.GetToken()))
	}
	if err != nil {
		r.s.metrics.apiServer("bad_request")
		r.s.log.Warn("bad apiserver dial", "subject", req.Subject(), "err", err)
		_ = req.Error(strconv.Itoa(events.CodeBadRequest), err.Error(), nil)
		return
	}
	if !r.acquire(node) {
		r.s.metrics.apiServer("over_limit")
		err := fmt.Errorf("node %s holds %d connections to kube-apiserver through the hub, the most this replica relays (--tunnel-apiserver-per-node)", node, r.s.cfg.APIServerPerNode)
		r.s.log.Warn("apiserver dial refused", "node", node, "err", err)
		_ = req.Error(strconv.Itoa(events.CodeTooMany), err.Error(), nil)
		return
	}
	if !r.s.hold() {
		r.release(node)
		_ = req.Error(strconv.Itoa(events.CodeUnavailable), "tunnel server shutting down", nil)
		return
	}
	go func() {
		defer r.s.wg.Done()
		defer r.release(node)
		r.serve(req, node, dial.GetToken())
	}()
}

func (r *apiServerRelay) serve(req micro.Request, node, token string) {
	s := r.s
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	defer cancel()
	var d net.Dialer
	api, err := d.DialContext(ctx, "tcp", s.cfg.APIServer)
	if err != nil {
		s.metrics.apiServer("apiserver_unreachable")
		s.log.Warn("apiserver dial failed", "node", node, "apiserver", s.cfg.APIServer, "err", err)
		_ = req.Error(strconv.Itoa(events.CodeUnavailable), fmt.Sprintf("atoll-cloud could not reach kube-apiserver at %s: %v", s.cfg.APIServer, err), nil)
		return
	}
	tc, err := s.Dial(ctx, node, tunnelproto.APIServerTarget+token)
	if err != nil {
		api.Close()
		s.metrics.apiServer("session_failed")
		s.log.Warn("apiserver session failed", "node", node, "err", err)
		_ = req.Error(strconv.Itoa(events.CodeUnavailable), fmt.Sprintf("tunnel session to node %s: %v", node, err), nil)
		return
	}
	out, err := events.NewMsg(req.Reply(), &atollv1.APIServerDialed{Session: tc.(*tunnelproto.Conn).Session(), Apiserver: s.cfg.APIServer}, "")
	if err == nil {
		err = req.Respond(out.Data, micro.WithHeaders(micro.Headers(out.Header)))
	}
	if err != nil {
		// No way to answer (the hub connection is gone): the agent's
		// wait ends, and its end of the session with it.
		api.Close()
		tc.Close()
		s.metrics.closed()
		s.metrics.apiServer("unanswered")
		return
	}
	s.metrics.apiServer("ok")
	s.relay(api, tc)
}

func (r *apiServerRelay) acquire(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[node] >= r.s.cfg.APIServerPerNode {
		return false
	}
	r.byNode[node]++
	return true
}

func (r *apiServerRelay) release(node string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byNode[node]--; r.byNode[node] <= 0 {
		delete(r.byNode, node)
	}
}
