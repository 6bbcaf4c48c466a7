package tunnel

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Peers names the unit peers a node's sessions may be relayed through.
type Peers interface {
	// Peers are the other members of node's unit, those whose own link
	// is up first.
	Peers(node string) []string
}

// LinkState tells whether a node's own leaf link is known down.
type LinkState interface {
	Down(node string) bool
}

// UnitViews keeps the members of every unit from the unit views the cloud
// publishes for the agents (the VIEWS stream; Run follows it), so it is
// the same membership the agents check, whatever the membership source.
type UnitViews struct {
	// Links, when set, orders peers whose own link is up first.
	Links LinkState

	mu      sync.RWMutex
	unitOf  map[string]string   // node → unit
	members map[string][]string // unit → nodes
}

// NewUnitViews is an empty set of units.
func NewUnitViews() *UnitViews {
	return &UnitViews{unitOf: map[string]string{}, members: map[string][]string{}}
}

// Apply replaces v's unit's members (an empty view empties the unit).
func (u *UnitViews) Apply(v *atollv1.UnitView) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range u.members[v.GetUnit()] {
		if u.unitOf[n] == v.GetUnit() {
			delete(u.unitOf, n)
		}
	}
	var names []string
	for _, m := range v.GetMembers() {
		names = append(names, m.GetName())
		u.unitOf[m.GetName()] = v.GetUnit()
	}
	slices.Sort(names)
	if len(names) == 0 {
		delete(u.members, v.GetUnit())
		return
	}
	u.members[v.GetUnit()] = names
}

// Peers implements Peers.
func (u *UnitViews) Peers(node string) []string {
	u.mu.RLock()
	unit, ok := u.unitOf[node]
	var out []string
	if ok {
		for _, n := range u.members[unit] {
			if n != node {
				out = append(out, n)
			}
		}
	}
	u.mu.RUnlock()
	if u.Links != nil {
		slices.SortStableFunc(out, func(a, b string) int {
			da, db := u.Links.Down(a), u.Links.Down(b)
			switch {
			case da == db:
				return 0
			case db:
				return -1
			default:
				return 1
			}
		})
	}
	return out
}

// Run follows the unit views of the VIEWS stream (the last of each unit,
// then every new one) until ctx ends.
func (u *UnitViews) Run(ctx context.Context, js jetstream.JetStream, evm *eventbus.Metrics, log *slog.Logger) error {
	spec := events.FollowSpec("tunnel-units", events.StreamViews, events.UnitViewFamily.Wildcard())
	return eventbus.Consume(ctx, js, spec, func(_ context.Context, ev eventbus.Event[*atollv1.UnitView]) error {
		u.Apply(ev.Msg)
		return nil
	}, eventbus.ConsumeOptions{Logger: log, Metrics: evm})
}

// Links follows the hub servers' connect and disconnect events of edge
// nodes' leaf connections (a system account connection's
// $SYS.ACCOUNT.<account>.CONNECT and .DISCONNECT): a node is down from the
// close of its leaf connection until a new one opens. Once subscribed it
// asks every hub server for the account's leaf connections
// ($SYS.REQ.SERVER.PING.LEAFZ); once they answered, a node with no leaf
// connection at all is down too (never linked since, or linked while
// this replica was not following).
type Links struct {
	mu    sync.Mutex
	conn  map[string]leafConn // node → its current leaf connection
	down  map[string]bool
	known bool // the servers' leaf connections were read: a node in no conn is down
	subs  []*nats.Subscription
	stop  chan struct{}
}

type leafConn struct {
	server string
	cid    uint64
}

// FollowLinks subscribes on sys to the leaf connection events of account.
func FollowLinks(sys *nats.Conn, account string) (*Links, error) {
	l := &Links{conn: map[string]leafConn{}, down: map[string]bool{}, stop: make(chan struct{})}
	for _, ev := range []string{"CONNECT", "DISCONNECT"} {
		subj := "$SYS.ACCOUNT." + account + "." + ev
		sub, err := sys.Subscribe(subj, l.handle)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("tunnel: follow leaf links: %w", err)
		}
		l.subs = append(l.subs, sub)
	}
	if err := sys.Flush(); err != nil {
		l.Close()
		return nil, fmt.Errorf("tunnel: follow leaf links: %w", err)
	}
	go l.snapshot(sys, account)
	return l, nil
}

// Leaf snapshot timing: the servers answer within leafzQuiet of each
// other; leafzWait bounds the whole read.
const (
	leafzQuiet = 300 * time.Millisecond
	leafzWait  = 3 * time.Second
)

// snapshot reads the leaf connections of account on every hub server
// and, once they answered, takes a node with none as down. Connections
// the events reported meanwhile win over the answers.
func (l *Links) snapshot(sys *nats.Conn, account string) {
	inbox := sys.NewRespInbox()
	replies := make(chan *nats.Msg, 64)
	sub, err := sys.ChanSubscribe(inbox, replies)
	if err != nil {
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	body, _ := json.Marshal(server.LeafzOptions{Account: account})
	if err := sys.PublishRequest("$SYS.REQ.SERVER.PING.LEAFZ", inbox, body); err != nil {
		return
	}
	found := map[string]leafConn{}
	answered := 0
	deadline := time.After(leafzWait)
	quiet := time.NewTimer(leafzWait)
	defer quiet.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-deadline:
		case <-quiet.C:
		case m := <-replies:
			var resp struct {
				Data *server.Leafz `json:"data"`
			}
			if json.Unmarshal(m.Data, &resp) == nil && resp.Data != nil {
				answered++
				for _, lf := range resp.Data.Leafs {
					if lf.Name != "" {
						found[lf.Name] = leafConn{server: resp.Data.ID, cid: lf.ID}
					}
				}
			}
			quiet.Reset(leafzQuiet)
			continue
		}
		break
	}
	if answered == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for node, c := range found {
		if _, ok := l.conn[node]; !ok && !l.down[node] {
			l.conn[node] = c
		}
	}
	l.known = true
}
func (l *Links) handle(m *nats.Msg) {
	var ev struct {
		Server server.ServerInfo `json:"server"`
		Client server.ClientInfo `json:"client"`
	}
	if json.Unmarshal(m.Data, &ev) != nil || ev.Client.Kind != "Leafnode" {
		return
	}
	role, node := identity.Holder(ev.Client.Tags)
	if role != identity.RoleEdge || node == "" {
		return
	}
	c := leafConn{server: ev.Server.ID, cid: ev.Client.ID}
	l.mu.Lock()
	defer l.mu.Unlock()
	if strings.HasSuffix(m.Subject, ".DISCONNECT") {
		// Only the close of the current connection: with several hub
		// servers, a reconnect elsewhere may be reported first.
		if cur, ok := l.conn[node]; !ok || cur == c {
			l.down[node] = true
			delete(l.conn, node)
		}
		return
	}
	l.conn[node] = c
	delete(l.down, node)
}

// Down implements LinkState.
func (l *Links) Down(node string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.known {
		_, linked := l.conn[node]
		return !linked
	}
	return l.down[node]
}

// Close stops following.
func (l *Links) Close() {
	for _, s := range l.subs {
		_ = s.Unsubscribe()
	}
	if l.stop != nil {
		select {
		case <-l.stop:
		default:
			close(l.stop)
		}
	}
}
