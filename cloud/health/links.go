package health

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/cloud/identity"
)

// LeafLink is one edge node's leaf connection opened or closed by a hub
// server.
type LeafLink struct {
	// Node is the edge node (its credentials' "name:" tag).
	Node string
	// Closed: the server closed the connection; otherwise it opened it.
	Closed bool
	// Start is when the connection opened; At when it opened or closed.
	// Both by the server's clock.
	Start, At time.Time
	// Server names the hub server, Reason why it closed.
	Server, Reason string
}

// ServerShutdown reports whether the hub server closed the connection
// because it is shutting down (lame duck mode closes every connection
// with this reason). It says nothing about the edge node's link: the node
// reconnects to another server of the hub within seconds, and its voter
// sends its ballot again on the new connection (edge/voter), so its votes
// are not cut. Should the node not come back, its ballots expire by their
// TTL. (A server killed outright reports nothing; nats-server 2.15 in
// lame duck mode reported none of the leafs it closed in
// test/e2e TestHubServerLoss either: this rule is for a server that
// does.)
func (l LeafLink) ServerShutdown() bool {
	return l.Closed && l.Reason == server.ServerShutdown.String()
}

// leafEvents is the system subject on which every hub server reports the
// connections of account it opens ($SYS.ACCOUNT.<account>.CONNECT) and
// closes (.DISCONNECT), leaf connections included: one subscription, so
// the events of one server arrive in the order it sent them.
func leafEvents(account string) string { return "$SYS.ACCOUNT." + account + ".*" }

// FollowLeafLinks subscribes, on sys (a system account user's
// connection), to the hub servers' connect and disconnect events of
// account (the application account's public key) and calls fn for each
// leaf connection of an edge node (role "edge") that opens or closes. A
// server notices a link that dies without closing (a cut cable) after its
// ping interval and missed pings, which may be after the node linked
// again; the ballots' TTL bounds the rest. Unsubscribe the returned
// subscription to stop.
func FollowLeafLinks(sys *nats.Conn, account string, log *slog.Logger, fn func(LeafLink)) (*nats.Subscription, error) {
	sub, err := sys.Subscribe(leafEvents(account), func(m *nats.Msg) {
		closed := strings.HasSuffix(m.Subject, ".DISCONNECT")
		if !closed && !strings.HasSuffix(m.Subject, ".CONNECT") {
			return
		}
		// A connect event is a disconnect event without its counts.
		var ev server.DisconnectEventMsg
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			log.Warn("undecodable connection event", "subject", m.Subject, "err", err)
			return
		}
		if l, ok := leafLink(ev, closed); ok {
			fn(l)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("health: follow leaf links: %w", err)
	}
	if err := sys.Flush(); err != nil {
		return nil, fmt.Errorf("health: follow leaf links: %w", err)
	}
	return sub, nil
}

// leafLink reads a connect (closed false) or disconnect event as an edge
// node's leaf link opening or closing; ok is false for any other
// connection.
func leafLink(ev server.DisconnectEventMsg, closed bool) (LeafLink, bool) {
	if ev.Client.Kind != "Leafnode" {
		return LeafLink{}, false
	}
	role, node := identity.Holder(ev.Client.Tags)
	if role != identity.RoleEdge || node == "" {
		return LeafLink{}, false
	}
	l := LeafLink{Node: node, Closed: closed, At: ev.Time, Server: ev.Server.Name, Reason: ev.Reason}
	if ev.Client.Start != nil {
		l.Start = *ev.Client.Start
	}
	switch {
	case closed && ev.Client.Stop != nil:
		l.At = *ev.Client.Stop
	case !closed && !l.Start.IsZero():
		l.At = l.Start
	}
	return l, true
}

// FollowLinks has the service stop counting a voter's votes as soon as the
// hub reports its leaf link closed (FollowLeafLinks over sys), until ctx
// is done; a link closed by a hub server shutting down is not a loss
// (LeafLink.ServerShutdown), nor is the close of a link older than the
// node's newest (Tracker.Superseded; a replica knows of the links opened
// while it runs). Each loss is recorded in LinksBucket, which every
// replica follows (Run), so the replicas agree and one that starts later
// knows it too; every replica records the same loss, which is harmless.
// Losses while no replica runs are not seen: their ballots expire by their
// TTL.
func (s *Service) FollowLinks(ctx context.Context, sys *nats.Conn, account string) error {
	sub, err := FollowLeafLinks(sys, account, s.log, func(l LeafLink) { s.LeafEvent(ctx, l) })
	if err != nil {
		return err
	}
	<-ctx.Done()
	return sub.Unsubscribe()
}

// LeafEvent applies one of the hub's leaf link events (FollowLinks).
func (s *Service) LeafEvent(ctx context.Context, l LeafLink) {
	if !l.Closed {
		s.tracker.LinkOpened(l.Node, l.Start)
		return
	}
	if l.ServerShutdown() {
		s.log.Info("a hub server shutting down closed a voter's leaf link: its votes keep counting while it reconnects to another server",
			"node", l.Node, "server", l.Server)
		s.metrics.linksMoved.Inc()
		return
	}
	if s.tracker.Superseded(l.Node, l.Start, l.At) {
		// The hub noticed an old link dead (its pings unanswered, a read
		// error, a duplicate) after the node linked again.
		s.log.Info("a voter's old leaf link closed after it linked again: nothing cut, its ballot over the new link replaces its votes",
			"node", l.Node, "server", l.Server, "reason", l.Reason, "closed", l.At)
		return
	}
	s.log.Debug("edge leaf link closed", "node", l.Node, "server", l.Server, "reason", l.Reason, "at", l.At)
	s.metrics.linksLost.Inc()
	s.LinkLost(ctx, l.Node, l.At) // at once on this replica
	kv := s.links.Load()
	if kv == nil {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := (*kv).Put(pctx, l.Node, []byte(l.At.UTC().Format(time.RFC3339Nano))); err != nil {
		s.log.Warn("cannot record a voter's link loss", "node", l.Node, "err", err)
	}
}
