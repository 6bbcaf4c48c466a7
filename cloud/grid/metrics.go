package grid

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics of the grid controllers (subsystem "grid").
type metrics struct {
	writes     *prometheus.CounterVec // by kind and op: apply, delete, release, status
	invalid    *prometheus.CounterVec // by kind: reconciles that found the spec invalid
	stalls     *prometheus.CounterVec // by kind: rollouts that stopped at their deadline
	unitEvents *prometheus.CounterVec // by event kind: unit events handled
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "grid", Name: "writes_total",
			Help: "Kubernetes writes of the grid controllers, by child kind and operation (apply, delete, release, status).",
		}, []string{"kind", "op"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "grid", Name: "invalid_total",
			Help: "Reconciles that found a grid's spec invalid (condition InvalidSpec), by kind.",
		}, []string{"kind"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "grid", Name: "rollout_stalls_total",
			Help: "Rollouts stopped by a unit past its progress deadline, by kind.",
		}, []string{"kind"}),
		unitEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "grid", Name: "unit_events_total",
			Help: "Unit lifecycle events from the hub handled (their grids enqueued), by kind.",
		}, []string{"kind"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.writes, m.invalid, m.stalls, m.unitEvents} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
