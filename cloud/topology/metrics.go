package topology

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	nodes, units                    prometheus.Gauge
	published, repaired, duplicates prometheus.Counter
	rotations                       prometheus.Counter
	rejected                        *prometheus.CounterVec
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
			Help: "Unit views and node assignments published because the stream did not hold their content.",
		}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "views_repaired_total",
			Help: "Views republished by a resync because the stream had lost or replaced content already published.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "views_duplicate_republished_total",
			Help: "Views the hub acknowledged as duplicates of a copy it no longer held, published again under a new id.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "views_rejected_total",
			Help: "Inputs left out of a view (route_url, internal_ip, node_key: once per bad value) and views not published (too_large, publish_failed, route_secret: per attempt).",
		}, []string{"reason"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "topology", Name: "route_secret_rotations_total",
			Help: "Unit route passwords replaced by this replica because a member left the unit (or the stored entry was of an older format).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.nodes, m.units, m.published, m.repaired, m.duplicates, m.rejected, m.rotations)
	}
	return m
}
