package health

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	patches   *prometheus.CounterVec
	unitState *prometheus.GaugeVec
	protected prometheus.Gauge
	deferred  prometheus.Counter
	votes     prometheus.Gauge
	repairs   prometheus.Counter
	linksLost prometheus.Counter
	// lateBallots counts ballots whose TTL had passed when handled.
	lateBallots prometheus.Counter
	// linksMoved counts leaf connections closed by a hub server's
	// shutdown, which cut nothing.
	linksMoved prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "patches_total",
			Help: "Kubernetes patches by kind (node, endpointslice, endpoints, configmap) and result (ok, retry, error).",
		}, []string{"kind", "result"}),
		unitState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "health", Name: "unit_disruption",
			Help: "1 for each unit's current disruption state (Normal, PartialDisruption, FullDisruption, AgentsSilent).",
		}, []string{"unit", "state"}),
		protected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "health", Name: "protected_nodes",
			Help: "Nodes the cloud lost that Atoll keeps serving (healthy verdict or held unit).",
		}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "reconciles_deferred_total",
			Help: "Reconciles put off because this replica had not caught up with the ballots of the stream.",
		}),
		lateBallots: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "ballots_expired_on_arrival_total",
			Help: "Ballots whose TTL had passed when they were handled (a consumer behind by more than the TTL): recorded, counted for no verdict.",
		}),
		repairs: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "repairs_total",
			Help: "Protected nodes this replica restored while it did not lead, because the leader had left them unprotected for the repair delay (a leader that died).",
		}),
		votes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "health", Name: "tracked_votes",
			Help: "Votes this replica keeps (expired ones are dropped at the first resync after the earliest expiry).",
		}),
		linksLost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "voter_links_lost_total",
			Help: "Edge leaf connections the hub reported closed; each stops its voter's votes from counting until its next ballot.",
		}),
		linksMoved: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "health", Name: "voter_links_moved_total",
			Help: "Edge leaf connections a hub server closed because it was shutting down (lame duck): the node reconnects to another server and its votes keep counting.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.patches, m.unitState, m.protected, m.deferred, m.votes, m.repairs, m.linksLost, m.linksMoved, m.lateBallots)
	}
	return m
}

func (m *metrics) setUnitState(unit string, state UnitState, gone bool) {
	for _, s := range UnitStates {
		if gone {
			m.unitState.DeleteLabelValues(unit, string(s))
			continue
		}
		v := 0.0
		if s == state {
			v = 1
		}
		m.unitState.WithLabelValues(unit, string(s)).Set(v)
	}
}
