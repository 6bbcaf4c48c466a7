package identity

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Holder reads who a connection's credentials name, from the tags the
// issuer puts in every user JWT (role:<role>, name:<name>); the hub
// servers' system events carry them. Both are empty for credentials
// Atoll did not issue.
func Holder(tags jwt.TagList) (role Role, name string) {
	for _, tag := range tags {
		switch {
		case strings.HasPrefix(tag, "role:"):
			role = Role(strings.TrimPrefix(tag, "role:"))
		case strings.HasPrefix(tag, "name:"):
			name = strings.TrimPrefix(tag, "name:")
		}
	}
	return role, name
}

// violationsQueue has one replica take each disconnect event, so the
// replicas' counters add up to the number of connections cut off.
const violationsQueue = "atoll-identity-violations"

// violationLogEvery is how often a node's cut-off connections are
// logged: the first at once, the next ones summed up at most this often,
// since a tampered edge can reconnect and try again in a loop.
const violationLogEvery = time.Minute

// violations logs and counts, by node, the connections of Atoll
// credentials that a hub server cut off for a protocol violation: a leaf
// that published or subscribed beyond its permissions (a tampered or
// misconfigured edge server: a standard one drops what the hub told it
// is not allowed, so the hub never sees it) or spoke the protocol wrong.
type violations struct {
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu   sync.Mutex
	last map[string]*violationLog // by node
}

type violationLog struct {
	at     time.Time // last logged
	unseen int       // cut off since, not logged yet
}

// FollowViolations logs and counts in m, by node, the connections of
// Atoll credentials that a hub server cut off for a protocol violation:
// it subscribes on sys (a system account user's connection) to the hub
// servers' disconnect events of account (the application account's public
// key), in a queue group, so that of several replicas one takes each
// event. The service follows them (Start); unsubscribe to stop.
func FollowViolations(sys *nats.Conn, account string, log *slog.Logger, m *Metrics) (*nats.Subscription, error) {
	v := &violations{log: log, metrics: m, now: time.Now}
	return v.follow(sys, account)
}

func (v *violations) follow(sys *nats.Conn, account string) (*nats.Subscription, error) {
	sub, err := sys.QueueSubscribe("$SYS.ACCOUNT."+account+".DISCONNECT", violationsQueue, func(m *nats.Msg) {
		var ev server.DisconnectEventMsg
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			v.log.Warn("undecodable disconnect event", "subject", m.Subject, "err", err)
			return
		}
		v.handle(ev)
	})
	if err != nil {
		return nil, fmt.Errorf("identity: follow violations: %w", err)
	}
	if err := sys.Flush(); err != nil {
		return nil, fmt.Errorf("identity: follow violations: %w", err)
	}
	return sub, nil
}

func (v *violations) handle(ev server.DisconnectEventMsg) {
	if ev.Reason != server.ProtocolViolation.String() {
		return
	}
	role, node := Holder(ev.Client.Tags)
	if node == "" {
		return
	}
	v.metrics.violations.WithLabelValues(string(role), node).Inc()
	now := v.now()
	v.mu.Lock()
	if l := v.last[node]; l != nil && now.Sub(l.at) < violationLogEvery {
		if l.unseen == 0 {
			time.AfterFunc(violationLogEvery-now.Sub(l.at), func() { v.flush(node) })
		}
		l.unseen++
		v.mu.Unlock()
		return
	}
	if v.last == nil || len(v.last) >= 4096 {
		v.forget(now)
	}
	v.last[node] = &violationLog{at: now}
	v.mu.Unlock()
	v.log.Warn("a hub server cut off a connection that sent what its credentials do not allow (its server logs the subject, on the same connection id)",
		"node", node, "role", role, "kind", ev.Client.Kind, "server", ev.Server.Name, "cid", ev.Client.ID,
		"host", ev.Client.Host, "reason", ev.Reason)
}

// flush logs how many of node's connections were cut off since it was
// last logged.
func (v *violations) flush(node string) {
	v.mu.Lock()
	l := v.last[node]
	if l == nil || l.unseen == 0 {
		v.mu.Unlock()
		return
	}
	n := l.unseen
	l.at, l.unseen = v.now(), 0
	v.mu.Unlock()
	v.log.Warn("hub servers cut off more connections that sent what their credentials do not allow",
		"node", node, "cut_off", n, "within", violationLogEvery)
}

// forget drops the nodes not logged within violationLogEvery (called
// with mu held), so the map stays as small as the nodes misbehaving now.
func (v *violations) forget(now time.Time) {
	if v.last == nil {
		v.last = map[string]*violationLog{}
		return
	}
	for node, l := range v.last {
		if now.Sub(l.at) >= violationLogEvery && l.unseen == 0 {
			delete(v.last, node)
		}
	}
}
