package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/test/poll"
)

// apiServer runs a Server on a fixed loopback address, and can be
// stopped and started again on it (a proxy restart); it counts the
// requests by kind.
type apiServer struct {
	t     *testing.T
	addr  string
	mu    sync.Mutex
	srv   *http.Server
	store *Store
	lists atomic.Int64
	watch atomic.Int64
}

func newAPIServer(t *testing.T, store *Store) *apiServer {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &apiServer{t: t, addr: l.Addr().String(), store: store}
	a.serve(l)
	t.Cleanup(a.stop)
	return a
}

func (a *apiServer) serve(l net.Listener) {
	api := NewServer(a.store, 200*time.Millisecond, slog.New(slog.DiscardHandler))
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := parse(r.URL.Path); ok && r.Method == http.MethodGet {
			// A relist is a list, or a watch that starts with the whole
			// state (a watch list, or a watch from "" or "0").
			q := r.URL.Query()
			rv := q.Get("resourceVersion")
			if q.Get("watch") == "true" {
				a.watch.Add(1)
			}
			if q.Get("watch") != "true" || q.Get("sendInitialEvents") == "true" || rv == "" || rv == "0" {
				a.lists.Add(1)
			}
		}
		api.ServeHTTP(w, r)
	})}
	go func() { _ = a.srv.Serve(l) }()
}

func (a *apiServer) stop() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.srv != nil {
		_ = a.srv.Close()
		a.srv = nil
	}
}

// restart stops the server and serves store on the same address.
func (a *apiServer) restart(store *Store) {
	a.stop()
	a.mu.Lock()
	defer a.mu.Unlock()
	var l net.Listener
	poll.Eventually(a.t, 10*time.Second, func() error {
		var err error
		l, err = net.Listen("tcp", a.addr)
		return err
	})
	a.store = store
	a.serve(l)
}

func (a *apiServer) config(protobuf bool) *rest.Config {
	c := &rest.Config{Host: "http://" + a.addr}
	if protobuf {
		c.ContentType = runtime.ContentTypeProtobuf
		c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	}
	return c
}

// unitStore is a store of host a1 (zone A) with Service web (topology
// key zone) and its slice over a1, a2 and b1.
func unitStore(t *testing.T) *Store {
	s := NewStore("a1", 100, nil)
	feed(t, s, testNode("a1", map[string]string{zone: "A"}), testNode("a2", map[string]string{zone: "A"}),
		testNode("b1", map[string]string{zone: "B"}), testService("web", zone, false), testSlice("web-1", "web", "a1", "a2", "b1"))
	return s
}

// informerView starts an unmodified client-go informer on endpointslices
// and returns a func giving the endpoint nodes it holds per slice.
func informerView(t *testing.T, cfg *rest.Config) func() map[string][]string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f := informers.NewSharedInformerFactory(cs, 0)
	inf := f.Discovery().V1().EndpointSlices().Informer()
	ctx, cancel := context.WithCancel(context.Background())
	f.Start(ctx.Done())
	t.Cleanup(func() { cancel(); f.Shutdown() })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	return func() map[string][]string {
		out := map[string][]string{}
		for _, o := range inf.GetStore().List() {
			sl := o.(*discoveryv1.EndpointSlice)
			var nodes []string
			for _, ep := range sl.Endpoints {
				nodes = append(nodes, *ep.NodeName)
			}
			slices.Sort(nodes)
			out[sl.Name] = nodes
		}
		return out
	}
}

func wantView(view func() map[string][]string, want map[string][]string) func() error {
	return func() error {
		got := view()
		if len(got) != len(want) {
			return fmt.Errorf("informer holds %v, want %v", got, want)
		}
		for k, v := range want {
			if !slices.Equal(got[k], v) {
				return fmt.Errorf("informer holds %v, want %v", got, want)
			}
		}
		return nil
	}
}

// TestInformer: an unmodified client-go informer (JSON and protobuf) lists
// and watches the filtered slices, follows changes, gets bookmarks,
// resumes after a proxy restart without a relist when the proxy still
// holds its revision, and relists after a 410 when it does not.
func TestInformer(t *testing.T) {
	for _, protobuf := range []bool{false, true} {
		t.Run(fmt.Sprint("protobuf=", protobuf), func(t *testing.T) {
			store := unitStore(t)
			api := newAPIServer(t, store)
			view := informerView(t, api.config(protobuf))
			poll.Eventually(t, 10*time.Second, wantView(view, map[string][]string{"web-1": {"a1", "a2"}}))

			// A change arrives by the watch.
			feed(t, store, testSlice("web-2", "web", "a2", "b1"))
			poll.Eventually(t, 10*time.Second, wantView(view, map[string][]string{"web-1": {"a1", "a2"}, "web-2": {"a2"}}))
			lists := api.lists.Load()

			// Bookmarks: the store moves (a node), no slice changes; a
			// watch with bookmarks learns the new revision.
			feed(t, store, testNode("c1", map[string]string{zone: "C"}))
			cs, err := kubernetes.NewForConfig(api.config(protobuf))
			if err != nil {
				t.Fatal(err)
			}
			w, err := cs.DiscoveryV1().EndpointSlices("").Watch(t.Context(), metav1.ListOptions{AllowWatchBookmarks: true, ResourceVersion: strconv.FormatUint(store.Rev()-1, 10)})
			if err != nil {
				t.Fatal(err)
			}
			for ev := range w.ResultChan() {
				if ev.Type != watch.Bookmark {
					t.Fatalf("got %s without a slice change", ev.Type)
				}
				if o := ev.Object.(*discoveryv1.EndpointSlice); o.ResourceVersion == strconv.FormatUint(store.Rev(), 10) {
					break
				}
			}
			w.Stop()

			// Restart with the same state: the informer resumes its watch
			// (no list) and gets what changed while the proxy was down.
			api.stop()
			feed(t, store, testSlice("web-3", "web", "a1"))
			api.restart(store)
			poll.Eventually(t, 20*time.Second, wantView(view, map[string][]string{"web-1": {"a1", "a2"}, "web-2": {"a2"}, "web-3": {"a1"}}))
			if got := api.lists.Load(); got != lists {
				t.Errorf("the informer relisted after a restart that kept the state (%d lists, was %d)", got, lists)
			}

			// Restart with a state that no longer holds the informer's
			// revision: 410 and a relist, after which it holds the new
			// state.
			fresh := NewStore("a1", 100, nil)
			feed(t, fresh, testNode("a1", map[string]string{zone: "A"}), testService("web", zone, false), testSlice("web-9", "web", "a1"))
			api.restart(fresh)
			poll.Eventually(t, 20*time.Second, wantView(view, map[string][]string{"web-9": {"a1"}}))
			if api.lists.Load() == lists {
				t.Error("no relist after 410")
			}
		})
	}
}

// TestGetListSelectors: get of the host's Node; the label and field
// selectors kube-proxy uses; an unknown field is refused; writes are
// accepted and counted.
func TestGetListSelectors(t *testing.T) {
	store := unitStore(t)
	headless := testService("db", "", true)
	headless.Labels = map[string]string{"service.kubernetes.io/headless": ""}
	other := testService("ext", "", false)
	other.Labels = map[string]string{"service.kubernetes.io/service-proxy-name": "someone-else"}
	feed(t, store, headless, other)
	api := newAPIServer(t, store)
	cs, err := kubernetes.NewForConfig(api.config(true))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	n, err := cs.CoreV1().Nodes().Get(ctx, "a1", metav1.GetOptions{})
	if err != nil || n.Labels[zone] != "A" {
		t.Fatalf("get node: %v %v", n, err)
	}
	if _, err := cs.CoreV1().Nodes().Get(ctx, "nope", metav1.GetOptions{}); err == nil {
		t.Fatal("got a node that does not exist")
	}
	nodes, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=a1"})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes by name: %v %v", nodes, err)
	}
	svcs, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"})
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs.Items) != 1 || svcs.Items[0].Name != "web" {
		t.Fatalf("services for kube-proxy: %v", svcs.Items)
	}
	if _, err := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{FieldSelector: "spec.bogus=1"}); err == nil {
		t.Fatal("an unknown field selector was accepted")
	}
	ns, err := cs.CoreV1().Services("kube-system").List(ctx, metav1.ListOptions{})
	if err != nil || len(ns.Items) != 0 {
		t.Fatalf("another namespace: %v %v", ns, err)
	}
	_, err = cs.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "e", Namespace: "default"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("event write: %v", err)
	}
	// An exact list of a revision not held is 410.
	_, err = cs.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{ResourceVersion: "1", ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if err == nil || !isGone(err) {
		t.Fatalf("exact list of an old revision: %v", err)
	}
}

func isGone(err error) bool {
	var st interface{ Status() metav1.Status }
	return errors.As(err, &st) && st.Status().Code == http.StatusGone
}
