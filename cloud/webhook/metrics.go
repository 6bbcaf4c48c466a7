package webhook

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/cloud/certgen"
)

// Values of the result label of atoll_webhook_requests_total.
const (
	resultPatched   = "patched"
	resultUnchanged = "unchanged"
	resultError     = "error"
)

// Values of the kind label: the three kinds handled, and everything else.
const (
	kindNode          = "Node"
	kindEndpoints     = "Endpoints"
	kindEndpointSlice = "EndpointSlice"
	kindOther         = "other"
)

type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	// invalid counts request bodies that are no AdmissionReview.
	invalid    prometheus.Counter
	rotations  *prometheus.CounterVec
	certExpiry prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "webhook", Name: "requests_total",
			Help: "Admission requests by kind and result (patched, unchanged, error). Errors are allowed unchanged.",
		}, []string{"kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "webhook", Name: "request_duration_seconds",
			Help:    "Time to decide an admission request, by kind.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1},
		}, []string{"kind"}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "webhook", Name: "invalid_requests_total",
			Help: "Request bodies that are not an AdmissionReview the webhook can decode; answered 400.",
		}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "webhook", Name: "cert_rotations_total",
			Help: "Changes to the generated certificates this replica wrote, by what changed (ca, serving, serving-to-new-ca, ca-expired-dropped).",
		}, []string{"what"}),
		certExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "webhook", Name: "cert_expiry_timestamp_seconds",
			Help: "When the generated serving certificate expires (Unix seconds).",
		}),
	}
	// Pre-create the series so rates start at zero.
	for _, k := range []string{kindNode, kindEndpoints, kindEndpointSlice} {
		for _, r := range []string{resultPatched, resultUnchanged, resultError} {
			m.requests.WithLabelValues(k, r)
		}
		m.duration.WithLabelValues(k)
	}
	for _, w := range certgen.Reasons {
		m.rotations.WithLabelValues(w)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.invalid, m.rotations, m.certExpiry)
	}
	return m
}
