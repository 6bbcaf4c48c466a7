package proxy

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	watchers   prometheus.Gauge
	changes    *prometheus.CounterVec
	eventsSent prometheus.Counter
	gone       prometheus.Counter
	writes     *prometheus.CounterVec
	requests   *prometheus.CounterVec
	viewBytes  prometheus.Counter
	viewSize   prometheus.Histogram
	eventBytes prometheus.Counter
	stateBytes prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "watchers",
			Help: "Open watches of the endpoints proxy.",
		}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "changes_total",
			Help: "Changes of the served objects (after the topology filter), by kind.",
		}, []string{"kind"}),
		eventsSent: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "watch_events_total",
			Help: "Watch events queued to watchers.",
		}),
		gone: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "gone_total",
			Help: "Resumes answered 410 Gone (the client relists).",
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "writes_dropped_total",
			Help: "Write requests (events, status updates) accepted and dropped, by resource.",
		}, []string{"resource"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "requests_total",
			Help: "Read requests served, by verb (get, list, watch, discovery) and code.",
		}, []string{"verb", "code"}),
		viewBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "view_bytes_total",
			Help: "Bytes of the object views received from the hub.",
		}),
		viewSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "view_message_bytes",
			Help:    "Size of each object view received (one per object change): its sum over its count is the bytes per change.",
			Buckets: prometheus.ExponentialBuckets(128, 2, 12),
		}),
		eventBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "watch_event_bytes_total",
			Help: "Bytes of the watch events written to clients (frames, bookmarks included).",
		}),
		stateBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "proxy", Name: "state_bytes",
			Help: "Size of the views kept on disk (snapshot and log), as last written.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.watchers, m.changes, m.eventsSent, m.gone, m.writes, m.requests, m.viewBytes, m.viewSize, m.eventBytes, m.stateBytes)
	}
	return m
}
