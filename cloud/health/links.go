package health

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/cloud/identity"
)

// LeafLoss is one edge node's leaf connection closed by a hub server.
type LeafLoss struct {
	// Node is the edge node (its credentials' "name:" tag).
	Node string
	// At is when the server closed the connection, by its clock.
	At time.Time
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
func (l LeafLoss) ServerShutdown() bool { return l.Reason == server.ServerShutdown.String() }

// leafDisconnects is the system subject on which every hub server reports
// the connections of account it closes, leaf connections included.
func leafDisconnects(account string) string { return "$SYS.ACCOUNT." + account + ".DISCONNECT" }

// FollowLeafLosses subscribes, on sys (a system account user's
// connection), to the hub servers' disconnect events of account (the
// application account's public key) and calls lost for each leaf
// connection of an edge node (role "edge") that closes. A server notices
// a link that dies without closing (a cut cable) after its ping interval
// and missed pings; the ballots' TTL bounds the rest. Unsubscribe the
// returned subscription to stop.
func FollowLeafLosses(sys *nats.Conn, account string, log *slog.Logger, lost func(LeafLoss)) (*nats.Subscription, error) {
	sub, err := sys.Subscribe(leafDisconnects(account), func(m *nats.Msg) {
		var ev server.DisconnectEventMsg
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			log.Warn("undecodable disconnect event", "subject", m.Subject, "err", err)
			return
		}
		l, ok := leafLoss(ev)
		if ok {
			lost(l)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("health: follow leaf losses: %w", err)
	}
	if err := sys.Flush(); err != nil {
		return nil, fmt.Errorf("health: follow leaf losses: %w", err)
	}
	return sub, nil
}

// leafLoss reads a disconnect event as the loss of an edge node's leaf
// link; ok is false for any other connection.
func leafLoss(ev server.DisconnectEventMsg) (LeafLoss, bool) {
	if ev.Client.Kind != "Leafnode" {
		return LeafLoss{}, false
	}
	role, node := identity.Holder(ev.Client.Tags)
	if role != identity.RoleEdge || node == "" {
		return LeafLoss{}, false
	}
	at := ev.Time
	if ev.Client.Stop != nil {
		at = *ev.Client.Stop
	}
	return LeafLoss{Node: node, At: at, Server: ev.Server.Name, Reason: ev.Reason}, true
}

// FollowLinks has the service stop counting a voter's votes as soon as the
// hub reports its leaf link closed (FollowLeafLosses over sys), until ctx
// is done; a link closed by a hub server shutting down is not a loss
// (LeafLoss.ServerShutdown). Each loss is recorded in LinksBucket, which every replica
// follows (Run), so the replicas agree and one that starts later knows
// it too; every replica records the same loss, which is harmless. Losses
// while no replica runs are not seen: their ballots expire by their TTL.
func (s *Service) FollowLinks(ctx context.Context, sys *nats.Conn, account string) error {
	sub, err := FollowLeafLosses(sys, account, s.log, func(l LeafLoss) {
		if l.ServerShutdown() {
			s.log.Info("a hub server shutting down closed a voter's leaf link: its votes keep counting while it reconnects to another server",
				"node", l.Node, "server", l.Server)
			s.metrics.linksMoved.Inc()
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
	})
	if err != nil {
		return err
	}
	<-ctx.Done()
	return sub.Unsubscribe()
}
