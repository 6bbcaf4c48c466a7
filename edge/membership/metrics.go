package membership

import "github.com/prometheus/client_golang/prometheus"

// The view label of the metrics and the names readiness uses.
const (
	viewAssignment = "assignment"
	viewUnit       = "unit view"
)

// labelOf is the metric label of a view kind.
func labelOf(kind string) string {
	if kind == viewUnit {
		return "unit_view"
	}
	return kind
}

type metrics struct {
	behind   *prometheus.GaugeVec
	catchups *prometheus.CounterVec
	lag      *prometheus.HistogramVec
	// checks counts comparisons with the stream that read it; checkErrors
	// the reads of the stream that failed.
	checks, checkErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		behind: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "membership", Name: "behind_seconds",
			Help: "How long the VIEWS stream has held a value of this view that the agent does not hold, at the last check (0: current).",
		}, []string{"view"}),
		catchups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "membership", Name: "catchups_total",
			Help: "Times the agent found it held an older value of a view than the stream and applied the stored one (its follower had missed it).",
		}, []string{"view"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "membership", Name: "catchup_lag_seconds",
			Help:    "How long the stream had held the value the agent caught up to.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 300, 1800},
		}, []string{"view"}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "membership", Name: "checks_total",
			Help: "Comparisons of the views held with the stream that could read the stream.",
		}),
		checkErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "membership", Name: "check_errors_total",
			Help: "Comparisons of a view held with the stream that could not read the stream (hub unreachable, no permission).",
		}),
	}
	for _, kind := range []string{viewAssignment, viewUnit} {
		m.behind.WithLabelValues(labelOf(kind)).Set(0)
		m.catchups.WithLabelValues(labelOf(kind))
	}
	if reg != nil {
		reg.MustRegister(m.behind, m.catchups, m.lag, m.checks, m.checkErrors)
	}
	return m
}
