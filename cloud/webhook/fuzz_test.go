package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// reviewBody is an AdmissionReview of obj (kind k) as the apiserver posts it.
func reviewBody(f *testing.F, k metav1.GroupVersionKind, op admissionv1.Operation, obj any) []byte {
	raw, err := json.Marshal(obj)
	if err != nil {
		f.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u", Kind: k, Operation: op, Name: "x",
			Object: runtime.RawExtension{Raw: raw}},
	})
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzAdmissionReview posts arbitrary bodies to the webhook's HTTP
// handler, as anyone who reaches its port can: it never panics, always
// answers an AdmissionReview, never denies a review it could decode, and
// answers a body it cannot decode with a 400 status that says why,
// counted in atoll_webhook_invalid_requests_total. A patch it returns is a
// JSON patch.
func FuzzAdmissionReview(f *testing.F) {
	f.Add(reviewBody(f, nodeKind, admissionv1.Update, testNode(protectedNode, taint(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute))))
	f.Add(reviewBody(f, endpointKind, admissionv1.Create, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Subsets: []corev1.EndpointSubset{{NotReadyAddresses: addrs(addr("10.0.0.1", protectedNode))}}}))
	f.Add(reviewBody(f, sliceKind, admissionv1.Update, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-1"},
		Endpoints: []discoveryv1.Endpoint{endpoint("10.0.0.1", protectedNode, conds(ptr(false), ptr(false), nil))}}))
	f.Add(reviewBody(f, podKind, admissionv1.Create, &corev1.Pod{}))
	f.Add(reviewBody(f, nodeKind, admissionv1.Update, "not a node"))
	f.Add([]byte(`{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{"uid":"1","kind":{"version":"v1","kind":"Node"},"operation":"UPDATE","object":{"spec":{"taints":7}}}}`))
	f.Add([]byte(`{"request":null}`))
	f.Add([]byte(`{`))
	f.Add([]byte{})
	f.Add([]byte("\xff\xfe\x00"))
	f.Fuzz(func(t *testing.T, body []byte) {
		reg := prometheus.NewRegistry()
		s, err := New(Config{Addr: "127.0.0.1:0", CertDir: "/unused"}, protecting(protectedNode), testLogger(t), reg)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		bounded(postOnly(s.Handler()), DefaultRequestTimeout, DefaultMaxRequestBytes).ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("HTTP %d: %s", w.Code, w.Body)
		}
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("answer is no AdmissionReview (%v): %s", err, w.Body)
		}
		invalid := invalidCount(t, reg)
		if !out.Response.Allowed {
			if out.Response.Result == nil || out.Response.Result.Code != http.StatusBadRequest || strings.TrimSpace(out.Response.Result.Message) == "" {
				t.Fatalf("denied without a 400 and a reason: %+v", out.Response.Result)
			}
			if invalid != 1 {
				t.Fatalf("invalid request counted %v times", invalid)
			}
			return
		}
		if invalid != 0 {
			t.Fatalf("an admitted request counted as invalid")
		}
		if len(out.Response.Patch) > 0 {
			var ops []map[string]any
			if err := json.Unmarshal(out.Response.Patch, &ops); err != nil || len(ops) == 0 {
				t.Fatalf("patch is no JSON patch (%v): %s", err, out.Response.Patch)
			}
		}
	})
}

// The handler's own decoding, below controller-runtime's: any object
// bytes for any of the three kinds.
func FuzzHandlerObject(f *testing.F) {
	f.Add(0, mustJSONf(f, testNode(protectedNode, taint(corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute))))
	f.Add(1, mustJSONf(f, &corev1.Endpoints{Subsets: []corev1.EndpointSubset{{NotReadyAddresses: addrs(addr("10.0.0.1", protectedNode))}}}))
	f.Add(2, mustJSONf(f, &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{endpoint("10.0.0.1", protectedNode, conds(ptr(false), nil, nil))}}))
	f.Add(0, []byte(`{"spec":{"taints":[{"key":null}]}}`))
	kinds := []metav1.GroupVersionKind{nodeKind, endpointKind, sliceKind}
	f.Fuzz(func(t *testing.T, k int, raw []byte) {
		h := &handler{policy: protecting(protectedNode), log: testLogger(t), metrics: newMetrics(nil)}
		kind := kinds[(k%3+3)%3]
		resp := h.Handle(t.Context(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Kind: kind, Operation: admissionv1.Update, Object: runtime.RawExtension{Raw: raw}}})
		if !resp.Allowed {
			t.Fatalf("denied: %+v", resp.Result)
		}
	})
}

func mustJSONf(f *testing.F, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// invalidCount is atoll_webhook_invalid_requests_total.
func invalidCount(t *testing.T, reg prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "atoll_webhook_invalid_requests_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("atoll_webhook_invalid_requests_total not registered")
	return 0
}
