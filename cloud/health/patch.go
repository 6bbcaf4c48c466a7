package health

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/manager"

	"github.com/atoll-edge/atoll/internal/protect"
)

// op is one JSON patch operation.
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// testOp asserts path holds value; JSON patch "test" compares the whole
// value, so a patch built from a stale read fails instead of writing to
// the wrong element.
func testOp(path string, value any) op { return op{Op: "test", Path: path, Value: value} }

// NodePatch is the one patch a reconcile writes to a node: the managed
// annotations set to want (keys not in want removed), and, when protected,
// the unreachable:NoExecute taint removed under a test of the current
// taints, the whole under a test of the resourceVersion read: a patch
// built from a stale read fails (and is rebuilt from a fresh read) instead
// of dropping a taint added meanwhile or writing the same annotations
// twice. Nil when the node already is as wanted.
func NodePatch(n *corev1.Node, want map[string]string, protected bool) ([]byte, error) {
	return nodePatch(n, want, protected, true)
}

// AnnotationPatch is NodePatch for the managed annotations alone: the
// taints are left as they are (the informational writes, see
// Service.annotate).
func AnnotationPatch(n *corev1.Node, want map[string]string) ([]byte, error) {
	return nodePatch(n, want, false, false)
}

func nodePatch(n *corev1.Node, want map[string]string, protected, taints bool) ([]byte, error) {
	var ops []op
	if kept, changed := protect.NodeTaints(n, protected); taints && changed {
		ops = append(ops,
			testOp("/spec/taints", n.Spec.Taints),
			op{Op: "replace", Path: "/spec/taints", Value: kept.Spec.Taints})
	}
	set := map[string]string{}
	var remove []string
	for _, k := range ManagedAnnotations {
		v, ok := want[k]
		cur, has := n.Annotations[k]
		switch {
		case ok && (!has || cur != v):
			set[k] = v
		case !ok && has:
			remove = append(remove, k)
		}
	}
	if n.Annotations == nil && len(set) > 0 {
		ops = append(ops, op{Op: "add", Path: "/metadata/annotations", Value: set})
	} else {
		for _, k := range ManagedAnnotations {
			if v, ok := set[k]; ok {
				ops = append(ops, op{Op: "add", Path: "/metadata/annotations/" + escape(k), Value: v})
			}
		}
		for _, k := range remove {
			ops = append(ops, op{Op: "remove", Path: "/metadata/annotations/" + escape(k)})
		}
	}
	if len(ops) == 0 {
		return nil, nil
	}
	// The whole patch holds only for the node as read: a cache that has
	// not yet seen this reconciler's previous write would otherwise write
	// the same annotations a second time.
	return json.Marshal(append([]op{testOp("/metadata/resourceVersion", n.ResourceVersion)}, ops...))
}

// escape makes a map key a JSON pointer token (RFC 6901).
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// EndpointSlicePatch marks ready and serving every endpoint of s on a node
// p protects that is not terminating. Each changed endpoint is guarded
// by tests of its node name, addresses and conditions, so several endpoints
// can move in one patch without index mistakes, and a patch built from a
// stale read fails instead of writing the same conditions twice. Nil when
// nothing changes.
func EndpointSlicePatch(s *discoveryv1.EndpointSlice, p protect.Policy) ([]byte, error) {
	want, changed := protect.EndpointSlice(s, p)
	if !changed {
		return nil, nil
	}
	var ops []op
	for i := range s.Endpoints {
		old, neu := s.Endpoints[i], want.Endpoints[i]
		if conditionsEqual(old.Conditions, neu.Conditions) {
			continue
		}
		base := "/endpoints/" + strconv.Itoa(i)
		ops = append(ops,
			testOp(base+"/nodeName", old.NodeName),
			testOp(base+"/addresses", old.Addresses),
			testOp(base+"/conditions", old.Conditions),
			op{Op: "replace", Path: base + "/conditions", Value: neu.Conditions})
	}
	if len(ops) == 0 {
		return nil, nil
	}
	return json.Marshal(ops)
}

func conditionsEqual(a, b discoveryv1.EndpointConditions) bool {
	eq := func(x, y *bool) bool { return (x == nil) == (y == nil) && (x == nil || *x == *y) }
	return eq(a.Ready, b.Ready) && eq(a.Serving, b.Serving) && eq(a.Terminating, b.Terminating)
}

// EndpointsPatch moves the not-ready addresses of nodes p protects to the
// ready addresses, replacing the subsets under a test of their current
// value. Nil when nothing changes.
func EndpointsPatch(e *corev1.Endpoints, p protect.Policy) ([]byte, error) {
	want, changed := protect.Endpoints(e, p)
	if !changed {
		return nil, nil
	}
	return json.Marshal([]op{
		testOp("/subsets", e.Subsets),
		{Op: "replace", Path: "/subsets", Value: want.Subsets},
	})
}

// patcher applies patches and retries a patch that failed because its
// read was stale, with a fresh read from the apiserver. The service has
// two, each on a client with its own rate limiter: one for protection
// writes, one for informational ones, so neither waits for the other's
// tokens.
type patcher struct {
	client  client.Client // writes
	fresh   client.Reader // reads that bypass the cache
	metrics *metrics
	// wrote, when set, is called after each patch the apiserver
	// accepted.
	wrote func(Write)
}

// Write is one patch the health service made.
type Write struct {
	// Kind is node, endpointslice, endpoints or configmap (the protected
	// set).
	Kind            string
	Namespace, Name string
	Time            time.Time
}

// newPatcher builds a patcher on a client of its own, on m's
// configuration with limits: its own rate limiter, reads uncached.
func newPatcher(m *manager.Manager, l Limits, met *metrics) (*patcher, error) {
	rc := rest.CopyConfig(m.GetConfig())
	rc.QPS, rc.Burst, rc.RateLimiter = l.QPS, l.Burst, nil
	c, err := client.New(rc, client.Options{Scheme: m.GetScheme(), Mapper: m.GetRESTMapper()})
	if err != nil {
		return nil, err
	}
	return &patcher{client: c, fresh: c, metrics: met}, nil
}

var retryBackoff = wait.Backoff{Steps: 5, Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2}

// retriable: a conflict, a failed "test" (the apiserver answers 422), or
// a transient server error.
func retriable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
}

// do builds a JSON patch from obj (first the cached object, then fresh
// reads into it) and applies it; build returns nil when nothing needs to
// change. At most one patch succeeds per call.
func do[T client.Object](ctx context.Context, p *patcher, kind string, obj T, build func(T) ([]byte, error)) error {
	key := client.ObjectKeyFromObject(obj)
	attempt := 0
	err := wait.ExponentialBackoffWithContext(ctx, retryBackoff, func(ctx context.Context) (bool, error) {
		if attempt > 0 {
			err := p.fresh.Get(ctx, key, obj)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil {
				return false, nil
			}
		}
		attempt++
		data, err := build(obj)
		if err != nil || data == nil {
			return true, err
		}
		err = p.client.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, data), client.FieldOwner(wellknown.FieldManager))
		switch {
		case err == nil:
			p.metrics.patches.WithLabelValues(kind, "ok").Inc()
			if p.wrote != nil {
				p.wrote(Write{Kind: kind, Namespace: key.Namespace, Name: key.Name, Time: time.Now()})
			}
			return true, nil
		case apierrors.IsNotFound(err):
			return true, nil
		case retriable(err):
			p.metrics.patches.WithLabelValues(kind, "retry").Inc()
			return false, nil
		default:
			return false, err
		}
	})
	if err != nil {
		p.metrics.patches.WithLabelValues(kind, "error").Inc()
		return fmt.Errorf("patch %s %s: %w", kind, key, err)
	}
	return nil
}

// The objects come from the cache: copy before patching into them.

func (p *patcher) node(ctx context.Context, n *corev1.Node, build func(*corev1.Node) ([]byte, error)) error {
	return do(ctx, p, "node", n.DeepCopy(), build)
}

func (p *patcher) endpointSlice(ctx context.Context, s *discoveryv1.EndpointSlice, protected protect.Policy) error {
	return do(ctx, p, "endpointslice", s.DeepCopy(), func(s *discoveryv1.EndpointSlice) ([]byte, error) {
		return EndpointSlicePatch(s, protected)
	})
}

func (p *patcher) endpoints(ctx context.Context, e *corev1.Endpoints, protected protect.Policy) error {
	return do(ctx, p, "endpoints", e.DeepCopy(), func(e *corev1.Endpoints) ([]byte, error) {
		return EndpointsPatch(e, protected)
	})
}
