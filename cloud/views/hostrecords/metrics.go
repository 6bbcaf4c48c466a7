package hostrecords

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	units     prometheus.Gauge
	records   prometheus.Gauge
	skipped   *prometheus.GaugeVec
	passes    prometheus.Counter
	published prometheus.Counter
	bytes     prometheus.Counter
	conflicts prometheus.Counter
	failed    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		units: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "units",
			Help: "Units the host records were computed for in the last pass.",
		}),
		records: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "records",
			Help: "Host records (IPs with names) of all units in the last pass.",
		}),
		skipped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "skipped",
			Help: "Grids and pods left out in the last pass, by reason (grid_key, not_owned, no_service).",
		}, []string{"reason"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "passes_total",
			Help: "Passes over the StatefulSetGrids and their pods.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "published_total",
			Help: "Unit record sets published because the stream did not hold their content.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "published_bytes_total",
			Help: "Bytes of the record sets published.",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "conflicts_total",
			Help: "Publishes refused because the subject's last stored value was not the one read.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "hostrecords", Name: "publish_failures_total",
			Help: "Record sets whose publish failed (retried by the next pass).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.units, m.records, m.skipped, m.passes, m.published, m.bytes, m.conflicts, m.failed)
	}
	return m
}
