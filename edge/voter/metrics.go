package voter

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	ignored   *prometheus.CounterVec
	published *prometheus.CounterVec
	verdicts  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "reports_ignored_total",
			Help: "Probe reports (or results in them) ignored, by reason: checker_not_member, peer_not_member, other_unit, not_newer.",
		}, []string{"reason"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "votes_published_total",
			Help: "Votes published, by verdict.",
		}, []string{"verdict"}),
		verdicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "members",
			Help: "Unit members by the voter's current verdict.",
		}, []string{"verdict"}),
	}
	if reg != nil {
		reg.MustRegister(m.ignored, m.published, m.verdicts)
	}
	return m
}
