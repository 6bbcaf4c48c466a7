package prober

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	checks    *prometheus.CounterVec
	round     prometheus.Histogram
	abnormal  prometheus.Gauge
	lastRound prometheus.Gauge
	workers   prometheus.Gauge
	fits      prometheus.Gauge
	unchecked prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "checks_total",
			Help: "Plugin checks of unit members, by plugin and result (ok, failed; refused: the member answered but refused the credentials the check sent, counted as up).",
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
		lastRound: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "last_round_seconds",
			Help: "Duration of the last round, checks and report (at most the round budget).",
		}),
		workers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "round_workers",
			Help: "Members checked at once in the last round (at most the configured parallelism).",
		}),
		fits: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "round_fits_budget",
			Help: "1 when the unit's worst-case round fits the round budget with the configured parallelism, else 0.",
		}),
		unchecked: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "prober", Name: "members_unchecked_total",
			Help: "Members left out of a report because the round's deadline came before their check ended.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.checks, m.round, m.abnormal, m.lastRound, m.workers, m.fits, m.unchecked)
	}
	return m
}
