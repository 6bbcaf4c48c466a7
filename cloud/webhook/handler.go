package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/atoll-edge/atoll/internal/protect"
)

// handler applies the protect rules to admission requests. It implements
// admission.Handler and never denies.
type handler struct {
	policy  Policy
	log     *slog.Logger
	metrics *metrics
}

var _ admission.Handler = (*handler)(nil)

// Handle returns a JSON patch when a rule changes the object, and an allowed
// response without a patch otherwise — also for kinds it does not know and
// objects it cannot decode (logged and counted as errors).
func (h *handler) Handle(_ context.Context, req admission.Request) admission.Response {
	start := time.Now()
	kind := kindLabel(req.Kind.Group, req.Kind.Version, req.Kind.Kind)
	resp, err := h.mutate(kind, req)
	result := resultUnchanged
	switch {
	case err != nil:
		result = resultError
		h.log.Warn("admitting unchanged", "kind", req.Kind.String(), "operation", req.Operation,
			"namespace", req.Namespace, "name", req.Name, "uid", req.UID, "err", err)
		resp = admission.Allowed("")
	case len(resp.Patches) > 0:
		result = resultPatched
		h.log.Debug("patched", "kind", kind, "operation", req.Operation,
			"namespace", req.Namespace, "name", req.Name, "ops", len(resp.Patches))
	}
	h.metrics.requests.WithLabelValues(kind, result).Inc()
	h.metrics.duration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	return resp
}

func (h *handler) mutate(kind string, req admission.Request) (admission.Response, error) {
	switch req.Operation {
	case admissionv1.Create, admissionv1.Update:
	default:
		return admission.Allowed(""), nil // nothing to mutate on DELETE or CONNECT
	}
	if len(req.Object.Raw) == 0 {
		return admission.Response{}, fmt.Errorf("%s %s/%s: empty object", kind, req.Namespace, req.Name)
	}
	switch kind {
	case kindNode:
		return patch(req.Object.Raw, func(n *corev1.Node) (*corev1.Node, bool) { return protect.Node(n, h.policy) })
	case kindEndpointSlice:
		return patch(req.Object.Raw, func(s *discoveryv1.EndpointSlice) (*discoveryv1.EndpointSlice, bool) {
			return protect.EndpointSlice(s, h.policy)
		})
	case kindEndpoints:
		return patch(req.Object.Raw, func(e *corev1.Endpoints) (*corev1.Endpoints, bool) { return protect.Endpoints(e, h.policy) })
	default:
		return admission.Response{}, fmt.Errorf("unexpected kind %s", req.Kind.String())
	}
}

// patch decodes raw into a T, applies rule and returns the JSON patch from
// the decoded object to the mutated one. Both sides are encoded from the
// same Go type, so the patch holds exactly the rule's change: diffing
// against raw instead would add noise (e.g. creationTimestamp: null on
// CREATE) and would remove any field newer than our k8s.io/api.
func patch[T any](raw []byte, rule func(*T) (*T, bool)) (admission.Response, error) {
	obj := new(T)
	if err := json.Unmarshal(raw, obj); err != nil {
		return admission.Response{}, fmt.Errorf("decode %T: %w", obj, err)
	}
	mutated, changed := rule(obj)
	if !changed {
		return admission.Allowed(""), nil
	}
	before, err := json.Marshal(obj)
	if err != nil {
		return admission.Response{}, fmt.Errorf("encode %T: %w", obj, err)
	}
	after, err := json.Marshal(mutated)
	if err != nil {
		return admission.Response{}, fmt.Errorf("encode mutated %T: %w", obj, err)
	}
	resp := admission.PatchResponseFromRaw(before, after)
	if !resp.Allowed {
		return admission.Response{}, fmt.Errorf("diff %T: %s", obj, resp.Result.Message)
	}
	return resp, nil
}

// kindLabel maps a request's kind to a metric label value.
func kindLabel(group, version, kind string) string {
	switch {
	case group == "" && version == "v1" && kind == "Node":
		return kindNode
	case group == "" && version == "v1" && kind == "Endpoints":
		return kindEndpoints
	case group == discoveryv1.GroupName && version == "v1" && kind == "EndpointSlice":
		return kindEndpointSlice
	}
	return kindOther
}
