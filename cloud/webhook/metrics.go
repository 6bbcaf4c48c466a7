package webhook

import "github.com/prometheus/client_golang/prometheus"

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
	}
	// Pre-create the series so rates start at zero.
	for _, k := range []string{kindNode, kindEndpoints, kindEndpointSlice} {
		for _, r := range []string{resultPatched, resultUnchanged, resultError} {
			m.requests.WithLabelValues(k, r)
		}
		m.duration.WithLabelValues(k)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration)
	}
	return m
}
