package proxy

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/internal/objectview"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestAdmitRelayed: a view a unit peer relays is refused when it would
// take the store back (stamped before the view held of its object, an
// object held as deleted) or when the cloud stamped it too far from this
// node's clock; a later one, the same one again and a recreated object
// (another uid) are admitted.
func TestAdmitRelayed(t *testing.T) {
	p, err := New(func() Config { c := DefaultConfig(); c.Enabled = true; return c }(), "a1", nil, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.Store()
	held := time.Now().Add(-time.Minute)
	svc := func(uid string, at time.Time) *atollv1.ObjectView {
		o := testService("web", "", false)
		o.UID = types.UID(uid)
		v := view(t, objectview.KindServices, o)
		v.Time = timestamppb.New(at)
		return v
	}
	admit := func(v *atollv1.ObjectView) error {
		t.Helper()
		data, err := proto.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return p.admit(viewfeed.Msg{Subject: "atoll.view._all.services.default.web", Data: data})
	}
	if err := s.Apply(SharedSpace, svc("u1", held), 1); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		v    *atollv1.ObjectView
		want string // "" admitted, else a part of the error
	}{
		{"stamped before the one held", svc("u1", held.Add(-time.Second)), "before the view held"},
		{"the same", svc("u1", held), ""},
		{"later", svc("u1", held.Add(time.Second)), ""},
		{"another object of that name", svc("u2", held.Add(-time.Second)), ""},
		{"stale", svc("u1", time.Now().Add(-3*time.Minute)), "beyond"},
		{"from the future", svc("u1", time.Now().Add(3*time.Minute)), "beyond"},
		{"without a time", func() *atollv1.ObjectView { v := svc("u1", held); v.Time = nil; return v }(), "without the cloud's time"},
	} {
		err := admit(tc.v)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: admit = %v, want %q", tc.name, err, tc.want)
		}
	}
	// Deleted: its last view replayed is refused, a new object of the
	// same name is not.
	gone := &atollv1.ObjectView{Kind: objectview.KindServices, Namespace: "default", Name: "web", Uid: "u1", Deleted: true}
	if err := s.Apply(SharedSpace, gone, 2); err != nil {
		t.Fatal(err)
	}
	if err := admit(svc("u1", held.Add(time.Second))); err == nil || !strings.Contains(err.Error(), "was deleted") {
		t.Errorf("a deleted object's view replayed: admit = %v", err)
	}
	if err := admit(svc("u2", held)); err != nil {
		t.Errorf("a new object of a deleted one's name: admit = %v", err)
	}
}
