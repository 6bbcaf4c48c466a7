package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// viewsHub is a restartable hub the test publishes views to as the
// cloud's object views publisher would.
type viewsHub struct {
	*natstest.RestartableHub
	mu sync.Mutex
	// The Nodes and Services published (publish), as the cloud's cache
	// holds them.
	nodes map[string]*corev1.Node
	svcs  map[string]*corev1.Service
}

func newViewsHub(t *testing.T) *viewsHub {
	t.Helper()
	return &viewsHub{RestartableHub: natstest.NewRestartableHub(t), nodes: map[string]*corev1.Node{}, svcs: map[string]*corev1.Service{}}
}

// publish publishes views the way the cloud publisher does: Nodes in
// unit's space; Services, slices and Endpoints in the shared space, a
// slice or Endpoints with its endpoints' topology (of the Nodes and
// Services published so far, these included).
func (r *viewsHub) publish(t *testing.T, unit string, objs ...objectview.Object) {
	t.Helper()
	var shared, own []objectview.Object
	r.mu.Lock()
	for _, o := range objs {
		switch o := o.(type) {
		case *corev1.Node:
			r.nodes[o.Name] = o
		case *corev1.Service:
			r.svcs[objKey(o.Namespace, o.Name)] = o
		}
	}
	for _, o := range objs {
		if _, ok := o.(*corev1.Node); ok {
			own = append(own, o)
			continue
		}
		shared = append(shared, cloudView(o, r.nodes, r.svcs))
	}
	r.mu.Unlock()
	r.publishTo(t, events.SharedSpace, shared...)
	r.publishTo(t, unit, own...)
}

// publishTo publishes objs in the view space of unit (a unit or
// events.SharedSpace), one subject per object, the view as its
// payload.
func (r *viewsHub) publishTo(t *testing.T, unit string, objs ...objectview.Object) {
	t.Helper()
	_, js := r.Connect(t, "cloud")
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		kind := kindOf(o)
		v := view(t, kind, o)
		subj, err := objectview.Subject(unit, kind, o.GetNamespace(), o.GetName())
		if err != nil {
			t.Fatal(err)
		}
		// A fresh id: the same content published again after a purge is
		// stored again (the cloud's LastValue does the same).
		if _, err := events.PublishDurable(ctx, js, subj, v, subj+"@"+v.GetFingerprint()+"@"+strconv.FormatInt(time.Now().UnixNano(), 36)); err != nil {
			t.Fatal(err)
		}
	}
}

type staticUnit string

// setNode makes the views published next carry n's labels in their
// topology, without publishing n (the cloud's Node view that comes late).
func (r *viewsHub) setNode(n *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes[n.Name] = n
}

func (u staticUnit) Unit() string           { return string(u) }
func (staticUnit) Changes() <-chan struct{} { return nil }

// runProxy runs a proxy of host a1 on addr (in network namespace ns, or
// the test's own when nil) with state in dir, over the edge server's
// link, until the returned stop is called.
func runProxy(t *testing.T, ns *netns, addr, dir string, node viewfeed.Node, link *hublink.Link, reg *metrics) (*Proxy, func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Enabled, cfg.Addr, cfg.StateDir, cfg.Bookmark, cfg.SaveDelay = true, addr, dir, 200*time.Millisecond, 10*time.Millisecond
	// Catch-ups every 300 ms: a rebuilt stream, which nothing announces
	// to a core subscription, is found within a second.
	fc := viewfeed.DefaultConfig()
	fc.CheckPeriod, fc.CatchUpLinger = 300*time.Millisecond, time.Second
	feeds, err := viewfeed.NewFeeds(fc, link, node, natstest.Logger(t, slog.LevelWarn), nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(cfg, "a1", feeds, staticUnit("u1"), natstest.Logger(t, slog.LevelWarn), reg)
	if err != nil {
		t.Fatal(err)
	}
	listen := p.Listen
	if ns != nil {
		listen = func() error { return ns.do(p.Listen) }
	}
	if err := listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return p, stop
}

// TestOfflineRestart: the proxy follows its unit's views from the hub;
// with the hub down, a restarted proxy serves the last views from disk
// within a second to a new informer (and an informer that ran across the
// restart resumes without a relist); when the hub is back, the changes
// made meanwhile arrive from the last stream sequence, without reading
// the rest of the stream again.
func TestOfflineRestart(t *testing.T) {
	rh := newViewsHub(t)
	rh.publish(t, "u1", testNode("a1", map[string]string{zone: "A"}), testNode("a2", map[string]string{zone: "A"}),
		testNode("b1", map[string]string{zone: "B"}), testService("web", zone, false), testSlice("web-1", "web", "a1", "b1"))
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
	link := hublink.Of(nc, js)
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := &rest.Config{Host: "http://" + addr}

	first, stop := runProxy(t, nil, addr, dir, edge, link, nil)
	long := informerView(t, cfg)
	poll.Eventually(t, 30*time.Second, wantView(long, map[string][]string{"web-1": {"a1"}}))
	// Both spaces read (each has its own feed) before the hub goes.
	poll.Eventually(t, 30*time.Second, func() error {
		for _, sp := range Spaces {
			if first.Store().SeqOf(sp) == 0 {
				return fmt.Errorf("the %s space not read yet", sp)
			}
		}
		return nil
	})

	// The hub goes down, then the proxy restarts.
	rh.Stop()
	stop()
	m := newMetrics(nil)
	started := time.Now()
	p, _ := runProxy(t, nil, addr, dir, edge, link, m)
	fresh := informerView(t, cfg)
	if err := wantView(fresh, map[string][]string{"web-1": {"a1"}})(); err != nil {
		t.Fatalf("after a restart with the hub down: %v", err)
	}
	if took := time.Since(started); took > time.Second {
		t.Fatalf("the last views were served %v after the restart, want within 1s", took)
	}
	t.Logf("views served %v after the restart with the hub down", time.Since(started))
	poll.Eventually(t, 10*time.Second, wantView(long, map[string][]string{"web-1": {"a1"}}))
	seq := p.Store().Seq()

	// The hub comes back with a change: only it is read.
	rh.Start()
	changed := testSlice("web-1", "web", "a1", "a2", "b1")
	rh.publish(t, "u1", changed)
	want := map[string][]string{"web-1": {"a1", "a2"}}
	poll.Eventually(t, 60*time.Second, wantView(fresh, want))
	poll.Eventually(t, 10*time.Second, wantView(long, want))
	b, err := proto.Marshal(view(t, objectview.KindEndpointSlices, cloudView(changed, rh.nodes, rh.svcs)))
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.viewBytes); got > float64(len(b))+64 {
		t.Fatalf("caught up with %v bytes of views for one change of %d bytes: the stream was read again", got, len(b))
	}
	var size dto.Metric
	if err := m.viewSize.Write(&size); err != nil {
		t.Fatal(err)
	}
	if n, sum := size.GetHistogram().GetSampleCount(), size.GetHistogram().GetSampleSum(); n != 1 || sum != testutil.ToFloat64(m.viewBytes) {
		t.Fatalf("view sizes: %d views of %v bytes, want the one change of %v bytes", n, sum, testutil.ToFloat64(m.viewBytes))
	}
	if testutil.ToFloat64(m.eventBytes) == 0 {
		t.Fatal("the watch events written to the informer were not counted")
	}
	if p.Store().Seq() != seq+1 {
		t.Fatalf("stream sequence %d after one change from %d", p.Store().Seq(), seq)
	}
	if fi, err := os.Stat(filepath.Join(dir, StateFile)); err == nil {
		t.Logf("state on disk: %d bytes", fi.Size())
	}
}
