package topology

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	nodes, units prometheus.Gauge
	published    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "nodes",
			Help: "Edge nodes known from their topology reports.",
		}),
		units: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "units",
			Help: "Units with at least one member.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "views_published_total",
			Help: "Unit views and node assignments published because their content changed.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.nodes, m.units, m.published)
	}
	return m
}
