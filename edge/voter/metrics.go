package voter

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of a ballot the hub did not store (sendFailures' reason).
const (
	reasonRetried    = "retried"    // sent again later
	reasonSuperseded = "superseded" // a newer ballot replaced it before it was stored
)

type metrics struct {
	ignored      *prometheus.CounterVec
	unverified   *prometheus.CounterVec
	published    *prometheus.CounterVec
	sendFailures *prometheus.CounterVec
	verdicts     *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "reports_ignored_total",
			Help: "Probe reports (or results in them) ignored, by reason: checker_not_member, peer_not_member, other_unit, not_newer, future.",
		}, []string{"reason"}),
		unverified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "reports_unverified_total",
			Help: "Probe reports of unit members dropped because their signature fails verification, by reason: unsigned, bad_signature (malformed or not the checker's key), no_key (the unit view publishes no key for the checker).",
		}, []string{"reason"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "ballots_published_total",
			Help: "Ballots stored by the hub's stream (acknowledged), by kind: change (a verdict, the membership or the link changed) or keepalive.",
		}, []string{"kind"}),
		sendFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "ballot_send_failures_total",
			Help: "Ballot sends the hub did not acknowledge, by what became of the ballot: retried (sent again after a backoff) or superseded (a newer ballot replaced it first).",
		}, []string{"reason"}),
		verdicts: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "voter", Name: "members",
			Help: "Unit members by the voter's current verdict.",
		}, []string{"verdict"}),
	}
	if reg != nil {
		reg.MustRegister(m.ignored, m.unverified, m.published, m.sendFailures, m.verdicts)
	}
	return m
}
