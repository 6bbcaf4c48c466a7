package health

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

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

// NodeTaintPatch removes the unreachable NoExecute taint from n when p
// protects it, guarded by a test of the current taints. Nil when there is
// nothing to remove.
func NodeTaintPatch(n *corev1.Node, p protect.Policy) ([]byte, error) {
	want, changed := protect.Node(n, p)
	if !changed {
		return nil, nil
	}
	return json.Marshal([]op{
		testOp("/spec/taints", n.Spec.Taints),
		{Op: "replace", Path: "/spec/taints", Value: want.Spec.Taints},
	})
}

// EndpointSlicePatch marks ready and serving every endpoint of s on a node
// p protects that is not terminating. Each changed endpoint is guarded
// by tests of its node name and addresses, so several endpoints can move
// in one patch without index mistakes. Nil when nothing changes.
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
			op{Op: "add", Path: base + "/conditions", Value: neu.Conditions})
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

// AnnotationsPatch sets want on a node and removes the managed keys not in
// want. Nil when the node already carries exactly that.
func AnnotationsPatch(current map[string]string, want map[string]string) ([]byte, error) {
	patch := map[string]any{}
	for _, k := range ManagedAnnotations {
		v, ok := want[k]
		cur, has := current[k]
		switch {
		case ok && (!has || cur != v):
			patch[k] = v
		case !ok && has:
			patch[k] = nil
		}
	}
	if len(patch) == 0 {
		return nil, nil
	}
	return json.Marshal(map[string]any{"metadata": map[string]any{"annotations": patch}})
}

// patcher applies patches and retries a patch that failed because its
// read was stale, with a fresh read from the apiserver.
type patcher struct {
	client  kubernetes.Interface
	metrics *metrics
}

var retryBackoff = wait.Backoff{Steps: 5, Duration: 50 * time.Millisecond, Factor: 2, Jitter: 0.2}

// retriable: a conflict, a failed "test" (the apiserver answers 422), or
// a transient server error.
func retriable(err error) bool {
	return apierrors.IsConflict(err) || apierrors.IsInvalid(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTooManyRequests(err) || apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)
}

// do builds a patch from obj (first the cached object, then fresh reads)
// and applies it; build returns nil when nothing needs to change.
func (p *patcher) do(ctx context.Context, kind, name string, first any, get func(context.Context) (any, error),
	build func(obj any) ([]byte, types.PatchType, error),
	apply func(ctx context.Context, data []byte, pt types.PatchType) error,
) error {
	obj := first
	attempt := 0
	err := wait.ExponentialBackoffWithContext(ctx, retryBackoff, func(ctx context.Context) (bool, error) {
		if attempt > 0 {
			fresh, err := get(ctx)
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil {
				return false, nil
			}
			obj = fresh
		}
		attempt++
		data, pt, err := build(obj)
		if err != nil || data == nil {
			return true, err
		}
		err = apply(ctx, data, pt)
		switch {
		case err == nil:
			p.metrics.patches.WithLabelValues(kind, "ok").Inc()
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
		return fmt.Errorf("patch %s %s: %w", kind, name, err)
	}
	return nil
}

func (p *patcher) node(ctx context.Context, n *corev1.Node, build func(*corev1.Node) ([]byte, types.PatchType, error)) error {
	nodes := p.client.CoreV1().Nodes()
	return p.do(ctx, "node", n.Name, n,
		func(ctx context.Context) (any, error) { return nodes.Get(ctx, n.Name, metav1.GetOptions{}) },
		func(o any) ([]byte, types.PatchType, error) { return build(o.(*corev1.Node)) },
		func(ctx context.Context, data []byte, pt types.PatchType) error {
			_, err := nodes.Patch(ctx, n.Name, pt, data, metav1.PatchOptions{FieldManager: wellknown.FieldManager})
			return err
		})
}

func (p *patcher) endpointSlice(ctx context.Context, s *discoveryv1.EndpointSlice, protected protect.Policy) error {
	api := p.client.DiscoveryV1().EndpointSlices(s.Namespace)
	return p.do(ctx, "endpointslice", s.Namespace+"/"+s.Name, s,
		func(ctx context.Context) (any, error) { return api.Get(ctx, s.Name, metav1.GetOptions{}) },
		func(o any) ([]byte, types.PatchType, error) {
			data, err := EndpointSlicePatch(o.(*discoveryv1.EndpointSlice), protected)
			return data, types.JSONPatchType, err
		},
		func(ctx context.Context, data []byte, pt types.PatchType) error {
			_, err := api.Patch(ctx, s.Name, pt, data, metav1.PatchOptions{FieldManager: wellknown.FieldManager})
			return err
		})
}

func (p *patcher) endpoints(ctx context.Context, e *corev1.Endpoints, protected protect.Policy) error {
	api := p.client.CoreV1().Endpoints(e.Namespace)
	return p.do(ctx, "endpoints", e.Namespace+"/"+e.Name, e,
		func(ctx context.Context) (any, error) { return api.Get(ctx, e.Name, metav1.GetOptions{}) },
		func(o any) ([]byte, types.PatchType, error) {
			data, err := EndpointsPatch(o.(*corev1.Endpoints), protected)
			return data, types.JSONPatchType, err
		},
		func(ctx context.Context, data []byte, pt types.PatchType) error {
			_, err := api.Patch(ctx, e.Name, pt, data, metav1.PatchOptions{FieldManager: wellknown.FieldManager})
			return err
		})
}
