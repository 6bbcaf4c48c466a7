package health

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/atoll-edge/atoll/internal/wellknown"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/atoll-edge/atoll/internal/protect"
)

func ptr[T any](v T) *T { return &v }

var protectX = protect.PolicyFunc(func(n string) bool { return n == "x" })

func apply(t *testing.T, obj any, patch []byte, into any) error {
	t.Helper()
	doc, _ := json.Marshal(obj)
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("decode patch %s: %v", patch, err)
	}
	out, err := p.Apply(doc)
	if err != nil {
		return err
	}
	return json.Unmarshal(out, into)
}

func endpoint(node, ip string, ready bool, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		NodeName:   ptr(node),
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(ready), Terminating: ptr(terminating)},
	}
}

func TestEndpointSlicePatch(t *testing.T) {
	tests := []struct {
		name      string
		endpoints []discoveryv1.Endpoint
		wantReady []bool // per endpoint after the patch; nil: no patch
	}{
		{"nothing on x", []discoveryv1.Endpoint{endpoint("y", "10.0.0.1", false, false)}, nil},
		{"x already ready", []discoveryv1.Endpoint{endpoint("x", "10.0.0.1", true, false)}, nil},
		{"one on x", []discoveryv1.Endpoint{endpoint("x", "10.0.0.1", false, false)}, []bool{true}},
		{"several on x interleaved", []discoveryv1.Endpoint{
			endpoint("x", "10.0.0.1", false, false),
			endpoint("y", "10.0.0.2", false, false),
			endpoint("x", "10.0.0.3", false, false),
			endpoint("x", "10.0.0.4", false, true), // terminating: left alone
		}, []bool{true, false, true, false}},
		{"nil conditions", []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.9"}, NodeName: ptr("x")}}, []bool{true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &discoveryv1.EndpointSlice{Endpoints: tt.endpoints}
			patch, err := EndpointSlicePatch(s, protectX)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantReady == nil {
				if patch != nil {
					t.Fatalf("unexpected patch %s", patch)
				}
				return
			}
			var got discoveryv1.EndpointSlice
			if err := apply(t, s, patch, &got); err != nil {
				t.Fatalf("apply %s: %v", patch, err)
			}
			for i, want := range tt.wantReady {
				c := got.Endpoints[i].Conditions
				if (c.Ready != nil && *c.Ready) != want || (c.Serving != nil && *c.Serving) != want {
					t.Errorf("endpoint %d: ready=%v serving=%v, want %v", i, c.Ready, c.Serving, want)
				}
			}
			// The same patch applied again (the cache has not yet seen
			// the first write) fails instead of writing the same
			// conditions twice.
			again := got.DeepCopy()
			if err := apply(t, again, patch, &discoveryv1.EndpointSlice{}); err == nil {
				t.Fatalf("patch %s applied twice", patch)
			}
			// The same patch against a slice whose endpoints moved since
			// the read fails instead of flipping the wrong endpoint.
			moved := &discoveryv1.EndpointSlice{Endpoints: append([]discoveryv1.Endpoint{endpoint("y", "10.9.9.9", false, false)}, tt.endpoints...)}
			if err := apply(t, moved, patch, &got); err == nil {
				t.Fatalf("patch %s applied to a changed slice", patch)
			}
		})
	}
}

func TestEndpointsPatch(t *testing.T) {
	addr := func(node, ip string) corev1.EndpointAddress {
		return corev1.EndpointAddress{IP: ip, NodeName: ptr(node)}
	}
	e := &corev1.Endpoints{Subsets: []corev1.EndpointSubset{
		{
			Addresses:         []corev1.EndpointAddress{addr("y", "10.0.0.1")},
			NotReadyAddresses: []corev1.EndpointAddress{addr("x", "10.0.0.2"), addr("y", "10.0.0.3"), addr("x", "10.0.0.4")},
			Ports:             []corev1.EndpointPort{{Port: 80}},
		},
		{
			NotReadyAddresses: []corev1.EndpointAddress{addr("y", "10.0.1.1"), addr("x", "10.0.1.2")},
			Ports:             []corev1.EndpointPort{{Port: 443}},
		},
	}}
	patch, err := EndpointsPatch(e, protectX)
	if err != nil || patch == nil {
		t.Fatalf("patch %s, %v", patch, err)
	}
	var got corev1.Endpoints
	if err := apply(t, e, patch, &got); err != nil {
		t.Fatal(err)
	}
	ips := func(as []corev1.EndpointAddress) (out []string) {
		for _, a := range as {
			out = append(out, a.IP)
		}
		return out
	}
	want := [][2][]string{
		{{"10.0.0.1", "10.0.0.2", "10.0.0.4"}, {"10.0.0.3"}},
		{{"10.0.1.2"}, {"10.0.1.1"}},
	}
	for i, w := range want {
		if g := ips(got.Subsets[i].Addresses); !equal(g, w[0]) {
			t.Errorf("subset %d ready = %v, want %v", i, g, w[0])
		}
		if g := ips(got.Subsets[i].NotReadyAddresses); !equal(g, w[1]) {
			t.Errorf("subset %d not ready = %v, want %v", i, g, w[1])
		}
	}
	if p, _ := EndpointsPatch(&got, protectX); p != nil {
		t.Errorf("second patch not empty: %s", p)
	}
	// A stale read fails its test.
	e.Subsets[0].Addresses = append(e.Subsets[0].Addresses, addr("y", "10.0.0.99"))
	if err := apply(t, e, patch, &got); err == nil {
		t.Fatal("patch applied to changed subsets")
	}
}

// TestNodePatch: annotations and the taint change are one patch, the
// taint part guarded by a test of the taints read.
func TestNodePatch(t *testing.T) {
	unreachable := func(e corev1.TaintEffect) corev1.Taint {
		return corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: e}
	}
	dedicated := corev1.Taint{Key: "dedicated", Value: "edge", Effect: corev1.TaintEffectNoExecute}
	tainted := []corev1.Taint{unreachable(corev1.TaintEffectNoSchedule), dedicated, unreachable(corev1.TaintEffectNoExecute)}
	want := map[string]string{wellknown.AnnotationVerdict: "healthy", wellknown.AnnotationVerdictSince: "2026-11-22T10:00:00Z"}
	tests := []struct {
		name        string
		annotations map[string]string
		taints      []corev1.Taint
		protected   bool
		wantAnn     map[string]string // nil: no patch expected
		wantTaints  []corev1.Taint
	}{
		{"protected: annotations and taint in one patch", map[string]string{"other": "kept", wellknown.AnnotationHoldUntil: "x"}, tainted, true,
			map[string]string{"other": "kept", wellknown.AnnotationVerdict: "healthy", wellknown.AnnotationVerdictSince: "2026-11-22T10:00:00Z"},
			[]corev1.Taint{unreachable(corev1.TaintEffectNoSchedule), dedicated}},
		{"not protected: annotations only", map[string]string{"other": "kept"}, tainted, false,
			map[string]string{"other": "kept", wellknown.AnnotationVerdict: "healthy", wellknown.AnnotationVerdictSince: "2026-11-22T10:00:00Z"}, tainted},
		{"no annotations yet", nil, nil, false, want, nil},
		{"already as wanted", map[string]string{wellknown.AnnotationVerdict: "healthy", wellknown.AnnotationVerdictSince: "2026-11-22T10:00:00Z"}, nil, true, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := &corev1.Node{Spec: corev1.NodeSpec{Taints: tt.taints}}
			n.Name, n.ResourceVersion, n.Annotations = "x", "7", tt.annotations
			patch, err := NodePatch(n, want, tt.protected)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantAnn == nil {
				if patch != nil {
					t.Fatalf("unexpected patch %s", patch)
				}
				return
			}
			var got corev1.Node
			if err := apply(t, n, patch, &got); err != nil {
				t.Fatalf("apply %s: %v", patch, err)
			}
			if !reflect.DeepEqual(got.Annotations, tt.wantAnn) {
				t.Errorf("annotations = %v, want %v", got.Annotations, tt.wantAnn)
			}
			if !reflect.DeepEqual(got.Spec.Taints, tt.wantTaints) {
				t.Errorf("taints = %v, want %v", got.Spec.Taints, tt.wantTaints)
			}
			if p, _ := NodePatch(&got, want, tt.protected); p != nil {
				t.Errorf("second patch not empty: %s", p)
			}
			// A stale read fails: taints or resourceVersion changed.
			stale := n.DeepCopy()
			stale.ResourceVersion = "8"
			stale.Spec.Taints = append(stale.Spec.Taints, corev1.Taint{Key: "new", Effect: corev1.TaintEffectNoSchedule})
			if apply(t, stale, patch, &got) == nil {
				t.Errorf("patch %s applied to a changed node", patch)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
