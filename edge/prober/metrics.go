package prober

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	checks   *prometheus.CounterVec
	round    prometheus.Histogram
	abnormal prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "checks_total",
			Help: "Plugin checks of unit members, by plugin and result (ok, failed).",
		}, []string{"plugin", "result"}),
		round: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "round_seconds",
			Help:    "Time to check every unit member once.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		abnormal: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "abnormal_members",
			Help: "Unit members below the scoreline in the last round.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.round, m.abnormal)
	}
	return m
}
