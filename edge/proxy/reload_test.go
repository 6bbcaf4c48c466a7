package proxy

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// deleteViews deletes the hub's VIEWS stream.
func (r *viewsHub) deleteViews(t *testing.T) {
	t.Helper()
	_, js := r.Connect(t, "cloud")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, events.StreamViews); err != nil {
		t.Fatal(err)
	}
}

// TestRebuiltStream: the hub's VIEWS stream is deleted and created again,
// holding more messages than before (so its sequences pass both the
// proxy's cursors) and the views at new sequences: web-1 as it was, web-2
// gone, web-3 new. The proxy notices the new stream on each cursor, reads
// both spaces again and emits only the real changes: web-2 deleted, web-3
// added, nothing for web-1, the Service or the Nodes.
func TestRebuiltStream(t *testing.T) {
	rh := newViewsHub(t)
	base := []objectview.Object{testNode("a1", map[string]string{zone: "A"}), testNode("b1", map[string]string{zone: "B"}),
		testService("web", zone, false), testSlice("web-1", "web", "a1", "b1")}
	rh.publish(t, "u1", append(base, testSlice("web-2", "web", "a1"))...)
	s := proxyOn(t, rh, t.TempDir()).Store()
	poll.Eventually(t, 30*time.Second, func() error {
		if _, ok := s.Get(objectview.KindEndpointSlices, "default", "web-2"); !ok {
			return fmt.Errorf("web-2 not served yet")
		}
		return nil
	})
	// Each space has its own feed: the unit's may catch up a moment later.
	poll.Eventually(t, 10*time.Second, func() error {
		if c := s.StreamCreated(SharedSpace); c == 0 || s.StreamCreated(UnitSpace) != c {
			return fmt.Errorf("the stream's creation time was not recorded on both cursors")
		}
		return nil
	})
	oldSeq, oldCreated := s.Seq(), s.StreamCreated(SharedSpace)
	var chans []<-chan Event
	for _, kind := range objectview.Kinds {
		_, _, ch, stop, err := s.Watch(kind, match{}, s.Rev(), false)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		chans = append(chans, ch)
	}

	rh.deleteViews(t)
	var padding []objectview.Object
	for i := range 2 * int(oldSeq) {
		padding = append(padding, testNode(fmt.Sprintf("x%d", i), nil))
	}
	rh.publishTo(t, "u9", padding...)
	rh.publish(t, "u1", append(base, testSlice("web-3", "web", "b1"))...)

	poll.Eventually(t, 60*time.Second, func() error {
		if _, ok := s.Get(objectview.KindEndpointSlices, "default", "web-2"); ok {
			return fmt.Errorf("web-2 still served")
		}
		if _, ok := s.Get(objectview.KindEndpointSlices, "default", "web-3"); !ok {
			return fmt.Errorf("web-3 not served")
		}
		for _, sp := range Spaces {
			if s.Reloading(sp) || s.StreamCreated(sp) == oldCreated {
				return fmt.Errorf("reload of the %s space not ended", sp)
			}
		}
		return nil
	})
	for _, sp := range Spaces {
		if seq := s.SeqOf(sp); seq <= oldSeq {
			t.Fatalf("%s sequence %d after the reload, want the new stream's (past %d)", sp, seq, oldSeq)
		}
	}
	var got []string
	for _, ch := range chans {
		got = append(got, eventNames(collect(ch))...)
	}
	want := []string{string(watch.Deleted) + " web-2", string(watch.Added) + " web-3"}
	if fmt.Sprint(got) != fmt.Sprint(want) && fmt.Sprint(got) != fmt.Sprint([]string{want[1], want[0]}) {
		t.Fatalf("events %v, want only %v", got, want)
	}
}

func eventNames(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Type)+" "+e.Obj.GetName())
	}
	return out
}

// proxyOn runs a proxy of a1 in u1 with its state in dir, through an
// edge server of rh.
func proxyOn(t *testing.T, rh *viewsHub, dir string) *Proxy {
	t.Helper()
	edge := natstest.Unit(t, rh, "u1", natstest.EdgeOptions{}, "a1")[0]
	nc, err := edge.Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, rh.Domain())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	p, _ := runProxy(t, nil, addr, dir, edge, hublink.Of(nc, js), nil)
	return p
}
