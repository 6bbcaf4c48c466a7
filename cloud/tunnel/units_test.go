package tunnel

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

type downSet map[string]bool

func (d downSet) Down(n string) bool { return d[n] }

func TestUnitViewsPeers(t *testing.T) {
	u := NewUnitViews()
	view := func(unit string, names ...string) *atollv1.UnitView {
		v := &atollv1.UnitView{Unit: unit}
		for _, n := range names {
			v.Members = append(v.Members, &atollv1.UnitMember{Name: n})
		}
		return v
	}
	u.Apply(view("u1", "c", "a", "b"))
	u.Apply(view("u2", "d"))
	tests := []struct {
		name, node string
		down       downSet
		want       []string
	}{
		{"sorted, without itself", "a", nil, []string{"b", "c"}},
		{"peers whose link is down last", "a", downSet{"b": true}, []string{"c", "b"}},
		{"alone in its unit", "d", nil, nil},
		{"in no unit", "x", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u.Links = nil
			if tt.down != nil {
				u.Links = tt.down
			}
			if got := u.Peers(tt.node); !slices.Equal(got, tt.want) {
				t.Fatalf("Peers(%s) = %q, want %q", tt.node, got, tt.want)
			}
		})
	}
	// A new view replaces the unit's members; an empty one empties it.
	u.Links = nil
	u.Apply(view("u1", "a", "c"))
	if got := u.Peers("a"); !slices.Equal(got, []string{"c"}) {
		t.Fatalf("after b left: %q", got)
	}
	if got := u.Peers("b"); got != nil {
		t.Fatalf("b left u1 but has peers %q", got)
	}
	u.Apply(view("u1"))
	if got := u.Peers("a"); got != nil {
		t.Fatalf("u1 is gone but a has peers %q", got)
	}
}

// TestLinksEvents: a node is down from its leaf connection's close until
// a new one opens; the close of an older connection (on another hub
// server, reported after the reconnect) does not mark it down; other
// connections are ignored.
func TestLinksEvents(t *testing.T) {
	l := &Links{conn: map[string]leafConn{}, down: map[string]bool{}}
	ev := func(kind, srv string, cid uint64, tags ...string) *nats.Msg {
		data, _ := json.Marshal(map[string]any{
			"server": server.ServerInfo{ID: srv},
			"client": server.ClientInfo{Kind: "Leafnode", ID: cid, Tags: tags},
		})
		return &nats.Msg{Subject: "$SYS.ACCOUNT.A." + kind, Data: data}
	}
	edge := []string{"role:edge", "name:n1"}
	steps := []struct {
		msg  *nats.Msg
		down bool
	}{
		{ev("CONNECT", "s1", 1, edge...), false},
		{ev("DISCONNECT", "s1", 1, edge...), true},
		{ev("CONNECT", "s2", 7, edge...), false},
		{ev("CONNECT", "s1", 2, edge...), false},
		{ev("DISCONNECT", "s2", 7, edge...), false}, // the older connection
		{ev("DISCONNECT", "s1", 9, "role:cloud", "name:n1"), false},
		{ev("DISCONNECT", "s1", 2, edge...), true},
	}
	for i, s := range steps {
		l.handle(s.msg)
		if got := l.Down("n1"); got != s.down {
			t.Fatalf("step %d: down %v, want %v", i, got, s.down)
		}
	}
}
