package webhook

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/test/promtest"
)

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// review posts an AdmissionReview to h and returns the response.
func review(t *testing.T, h http.Handler, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	t.Helper()
	body := mustJSON(t, admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  req,
	})
	r := httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("decode review: %v\n%s", err, w.Body)
	}
	if out.Response == nil {
		t.Fatalf("no response: %s", w.Body)
	}
	if out.Response.UID != req.UID {
		t.Errorf("response uid %q, want %q", out.Response.UID, req.UID)
	}
	return out.Response
}

var (
	nodeKind     = metav1.GroupVersionKind{Version: "v1", Kind: "Node"}
	sliceKind    = metav1.GroupVersionKind{Group: "discovery.k8s.io", Version: "v1", Kind: "EndpointSlice"}
	endpointKind = metav1.GroupVersionKind{Version: "v1", Kind: "Endpoints"}
	podKind      = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
)

// TestHandler runs admission reviews through the HTTP handler and applies
// the returned patches to the objects as sent, like the apiserver does.
func TestHandler(t *testing.T) {
	tests := []struct {
		name   string
		kind   metav1.GroupVersionKind
		op     admissionv1.Operation
		object any    // encoded as the request's object
		raw    []byte // used instead of object when set
		want   any    // object after the patch; nil: no patch
		kindL  string // metric labels
		result string
	}{
		{
			name: "protected node loses NoExecute",
			kind: nodeKind, op: admissionv1.Update,
			object: testNode("a", unreachableNoSchedule, unreachableNoExecute),
			want:   testNode("a", unreachableNoSchedule),
			kindL:  kindNode, result: resultPatched,
		},
		{
			name: "unprotected node unchanged",
			kind: nodeKind, op: admissionv1.Update,
			object: testNode("b", unreachableNoSchedule, unreachableNoExecute),
			kindL:  kindNode, result: resultUnchanged,
		},
		{
			name: "endpoint slice on create",
			kind: sliceKind, op: admissionv1.Create,
			object: &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "web-x", Namespace: "ns"},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{
					endpoint("10.0.0.1", "b", conds(ptr(false), ptr(false), nil)),
					endpoint("10.0.0.2", "a", conds(ptr(false), ptr(false), nil)),
				},
			},
			want: &discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "web-x", Namespace: "ns"},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints: []discoveryv1.Endpoint{
					endpoint("10.0.0.1", "b", conds(ptr(false), ptr(false), nil)),
					endpoint("10.0.0.2", "a", conds(ptr(true), ptr(true), nil)),
				},
			},
			kindL: kindEndpointSlice, result: resultPatched,
		},
		{
			name: "endpoints: interleaved addresses",
			kind: endpointKind, op: admissionv1.Update,
			object: &corev1.Endpoints{
				ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
				Subsets: []corev1.EndpointSubset{{
					Addresses:         addrs(addr("10.0.0.9", "b")),
					NotReadyAddresses: addrs(addr("10.0.0.1", "a"), addr("10.0.0.2", "b"), addr("10.0.0.3", "a"), addr("10.0.0.4", "b")),
					Ports:             []corev1.EndpointPort{{Port: 80}},
				}},
			},
			want: &corev1.Endpoints{
				ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"},
				Subsets: []corev1.EndpointSubset{{
					Addresses:         addrs(addr("10.0.0.9", "b"), addr("10.0.0.1", "a"), addr("10.0.0.3", "a")),
					NotReadyAddresses: addrs(addr("10.0.0.2", "b"), addr("10.0.0.4", "b")),
					Ports:             []corev1.EndpointPort{{Port: 80}},
				}},
			},
			kindL: kindEndpoints, result: resultPatched,
		},
		{
			name: "unknown kind allowed unchanged",
			kind: podKind, op: admissionv1.Update,
			object: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}},
			kindL:  kindOther, result: resultError,
		},
		{
			name: "undecodable object allowed unchanged",
			kind: nodeKind, op: admissionv1.Update,
			raw:   []byte(`{"metadata":{"name":"a"},"spec":{"taints":"not a list"}}`),
			kindL: kindNode, result: resultError,
		},
		{
			name: "delete allowed unchanged",
			kind: nodeKind, op: admissionv1.Delete,
			kindL: kindNode, result: resultUnchanged,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			s, err := New(Config{Addr: ":0", CertDir: t.TempDir()}, protecting("a"), testLogger(t), reg)
			if err != nil {
				t.Fatal(err)
			}
			raw := tt.raw
			if raw == nil && tt.object != nil {
				raw = mustJSON(t, tt.object)
			}
			resp := review(t, s.Handler(), &admissionv1.AdmissionRequest{
				UID:       types.UID("uid-" + tt.name),
				Kind:      tt.kind,
				Operation: tt.op,
				Object:    runtime.RawExtension{Raw: raw},
			})
			if !resp.Allowed {
				t.Fatalf("denied: %+v", resp.Result)
			}
			if tt.want == nil {
				if len(resp.Patch) != 0 || resp.PatchType != nil {
					t.Errorf("unexpected patch %s", resp.Patch)
				}
			} else {
				if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
					t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
				}
				p, err := jsonpatch.DecodePatch(resp.Patch)
				if err != nil {
					t.Fatalf("decode patch %s: %v", resp.Patch, err)
				}
				patched, err := p.Apply(raw)
				if err != nil {
					t.Fatalf("apply patch %s: %v", resp.Patch, err)
				}
				var got, want any
				if err := json.Unmarshal(patched, &got); err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(mustJSON(t, tt.want), &want); err != nil {
					t.Fatal(err)
				}
				checkEqual(t, "patched object", want, got)
				t.Logf("patch: %s", resp.Patch)
			}
			if got := counter(t, reg, tt.kindL, tt.result); got != 1 {
				t.Errorf("requests_total{kind=%q,result=%q} = %v, want 1", tt.kindL, tt.result, got)
			}
		})
	}
}

// TestHandlerPatchKeepsUnknownFields: the patch is computed between two
// encodings of the same Go type, so fields our k8s.io/api does not know
// survive and no spurious operations (creationTimestamp: null on CREATE)
// appear.
func TestHandlerPatchKeepsUnknownFields(t *testing.T) {
	s, err := New(Config{Addr: ":0", CertDir: t.TempDir()}, protecting("a"), testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(`{"apiVersion":"v1","kind":"Node","metadata":{"name":"a","futureMeta":1},` +
		`"spec":{"futureField":"x","taints":[{"key":"node.kubernetes.io/unreachable","effect":"NoExecute"}]}}`)
	resp := review(t, s.Handler(), &admissionv1.AdmissionRequest{
		UID: "u", Kind: nodeKind, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
	})
	var ops []map[string]any
	if err := json.Unmarshal(resp.Patch, &ops); err != nil {
		t.Fatalf("patch %s: %v", resp.Patch, err)
	}
	if len(ops) != 1 || ops[0]["path"] != "/spec/taints" || ops[0]["op"] != "remove" {
		t.Errorf("patch %s, want one remove of /spec/taints", resp.Patch)
	}
}

func TestHandlerRejectsNonPost(t *testing.T) {
	dir := t.TempDir()
	writeSelfSigned(t, dir)
	s, err := New(Config{Addr: "127.0.0.1:0", CertDir: dir}, protecting("a"), testLogger(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(t.Context()) })
	c := tlsClient(t, dir)
	resp, err := c.Get("https://" + s.Addr() + "/mutate")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /mutate: %d, want 405", resp.StatusCode)
	}
}

// counter returns the value of atoll_webhook_requests_total{kind,result}.
func counter(t *testing.T, reg prometheus.Gatherer, kind, result string) float64 {
	t.Helper()
	return promtest.Counter(t, reg, "atoll_webhook_requests_total", map[string]string{"kind": kind, "result": result})
}
