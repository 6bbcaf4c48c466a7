package objects

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	units     prometheus.Gauge
	fanout    prometheus.Histogram
	passes    prometheus.Counter
	published *prometheus.CounterVec
	bytes     prometheus.Counter
	conflicts prometheus.Counter
	rejected  *prometheus.CounterVec
	repaired  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		units: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "units",
			Help: "Units whose own Nodes are published in their view space.",
		}),
		fanout: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "fanout",
			Help:    "Views stored per object handled in a pass: 1 (its view), 2 for a Node that moved unit, 0 when nothing changed.",
			Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "passes_total",
			Help: "Passes over the changed (or, on a resync, all) objects.",
		}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "published_total",
			Help: "Object views published because the stream did not hold their content, by kind.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "published_bytes_total",
			Help: "Bytes of the object views published (payloads, all units).",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "conflicts_total",
			Help: "Publishes refused because the subject's last stored value was not the one read.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "rejected_total",
			Help: "Object views not published, by reason (subject, too_large, publish_failed).",
		}, []string{"reason"}),
		repaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "objectviews", Name: "repaired_total",
			Help: "Stored object views found unservable (not decoding, of another kind, a topology not decoding) and stored again from the cluster, by kind.",
		}, []string{"kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.units, m.fanout, m.passes, m.published, m.bytes, m.conflicts, m.rejected, m.repaired)
	}
	return m
}
