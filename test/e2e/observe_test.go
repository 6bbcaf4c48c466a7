package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// observer records what clients see of protected nodes and their web
// pods while it runs: every event of a watch of the Nodes, of the pods and
// of the EndpointSlices, and a poll of each every 200 ms. It counts, as a
// violation, a protected pod deleted or an endpoint of one not ready, and
// measures for how long each node carried the unreachable:NoExecute taint
// (what the taint manager acts on).
type observer struct {
	protected map[string]string // node → namespace of its web pod
	begin     time.Time

	mu          sync.Mutex
	noExecSince map[string]time.Time
	noExecFor   map[string]time.Duration // longest, per node
	events      int
	polls       int
	violations  []string
	stop        context.CancelFunc
	done        sync.WaitGroup
}

// observe starts observing protected (node → its web pod's namespace);
// stop it with observer.end.
func (e *env) observe(t *testing.T, protected map[string]string) *observer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	o := &observer{protected: protected, begin: time.Now(), noExecSince: map[string]time.Time{}, noExecFor: map[string]time.Duration{}, stop: cancel}
	namespaces := map[string]bool{}
	for _, ns := range protected {
		namespaces[ns] = true
	}
	watches := []func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error){
		func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return e.client.CoreV1().Nodes().Watch(ctx, opts)
		},
	}
	lists := []func(ctx context.Context) (string, error){
		func(ctx context.Context) (string, error) {
			l, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return "", err
			}
			return l.ResourceVersion, nil
		},
	}
	for ns := range namespaces {
		watches = append(watches,
			func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return e.client.CoreV1().Pods(ns).Watch(ctx, opts)
			},
			func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
				return e.client.DiscoveryV1().EndpointSlices(ns).Watch(ctx, opts)
			})
		lists = append(lists,
			func(ctx context.Context) (string, error) {
				l, err := e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					return "", err
				}
				return l.ResourceVersion, nil
			},
			func(ctx context.Context) (string, error) {
				l, err := e.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					return "", err
				}
				return l.ResourceVersion, nil
			})
	}
	for i, w := range watches {
		rv, err := lists[i](ctx)
		if err != nil {
			t.Fatal(err)
		}
		rw, err := watchtools.NewRetryWatcherWithContext(ctx, rv, &cache.ListWatch{WatchFuncWithContext: w})
		if err != nil {
			t.Fatal(err)
		}
		o.done.Go(func() {
			defer rw.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-rw.ResultChan():
					if !ok {
						return
					}
					o.see(ev.Type, ev.Object, "watch")
				}
			}
		})
	}
	o.done.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			o.poll(ctx, e)
		}
	})
	t.Cleanup(o.end)
	return o
}

func (o *observer) poll(ctx context.Context, e *env) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// A poll the apiserver does not answer sees nothing: no error.
	for node, ns := range o.protected {
		if n, err := e.client.CoreV1().Nodes().Get(cctx, node, metav1.GetOptions{}); err == nil {
			o.see(watch.Modified, n, "poll")
		}
		if p, err := e.client.CoreV1().Pods(ns).Get(cctx, "web-"+node, metav1.GetOptions{}); err == nil {
			o.see(watch.Modified, p, "poll")
		} else if ctx.Err() == nil && cctx.Err() == nil && apierrors.IsNotFound(err) {
			o.violate("poll: pod %s/web-%s is gone", ns, node)
		}
	}
	for ns := range o.nsSet() {
		if l, err := e.client.DiscoveryV1().EndpointSlices(ns).List(cctx, metav1.ListOptions{}); err == nil {
			for i := range l.Items {
				o.see(watch.Modified, &l.Items[i], "poll")
			}
		}
	}
	o.mu.Lock()
	o.polls++
	o.mu.Unlock()
}

func (o *observer) nsSet() map[string]bool {
	out := map[string]bool{}
	for _, ns := range o.protected {
		out[ns] = true
	}
	return out
}

func (o *observer) see(typ watch.EventType, obj any, how string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if how == "watch" {
		o.events++
	}
	now := time.Now()
	switch x := obj.(type) {
	case *corev1.Node:
		if _, ok := o.protected[x.Name]; !ok {
			return
		}
		since, tainted := o.noExecSince[x.Name]
		switch has := hasTaint(x, corev1.TaintEffectNoExecute); {
		case has && !tainted:
			o.noExecSince[x.Name] = now
		case !has && tainted:
			delete(o.noExecSince, x.Name)
			o.noExecFor[x.Name] = max(o.noExecFor[x.Name], now.Sub(since))
		}
	case *corev1.Pod:
		node := x.Spec.NodeName
		if ns, ok := o.protected[node]; !ok || ns != x.Namespace || x.Name != "web-"+node {
			return
		}
		if typ == watch.Deleted || x.DeletionTimestamp != nil {
			o.violateLocked("%s: pod %s/%s evicted", how, x.Namespace, x.Name)
		}
	case *discoveryv1.EndpointSlice:
		if typ == watch.Deleted {
			return
		}
		for _, ep := range x.Endpoints {
			if ep.NodeName == nil || ep.TargetRef == nil {
				continue
			}
			if ns, ok := o.protected[*ep.NodeName]; ok && ns == x.Namespace && ep.TargetRef.Name == "web-"+*ep.NodeName &&
				(ep.Conditions.Ready == nil || !*ep.Conditions.Ready) {
				o.violateLocked("%s: endpoint of %s/%s not ready in EndpointSlice %s", how, x.Namespace, ep.TargetRef.Name, x.Name)
			}
		}
	}
}

func (o *observer) violate(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.violateLocked(format, args...)
}

func (o *observer) violateLocked(format string, args ...any) {
	if len(o.violations) < 50 {
		o.violations = append(o.violations, fmt.Sprintf("%6.1fs ", time.Since(o.begin).Seconds())+fmt.Sprintf(format, args...))
	}
}

// end stops observing (idempotent).
func (o *observer) end() {
	o.stop()
	o.done.Wait()
}

// check ends the observation and fails t on any violation, or on a
// NoExecute taint carried longer than bound; it logs what it saw.
func (o *observer) check(t *testing.T, bound time.Duration) {
	t.Helper()
	o.end()
	o.mu.Lock()
	defer o.mu.Unlock()
	now := time.Now()
	for n, since := range o.noExecSince {
		o.noExecFor[n] = max(o.noExecFor[n], now.Sub(since))
	}
	var longest []string
	for n, d := range o.noExecFor {
		longest = append(longest, fmt.Sprintf("%s %s", n, d.Round(100*time.Millisecond)))
		if d > bound {
			t.Errorf("%s carried unreachable:NoExecute for %s (bound %s)", n, d.Round(100*time.Millisecond), bound)
		}
	}
	sort.Strings(longest)
	t.Logf("observed %s: %d watch events, %d polls; NoExecute carried: %v", time.Since(o.begin).Round(time.Second), o.events, o.polls, longest)
	for _, v := range o.violations {
		t.Error(v)
	}
}
