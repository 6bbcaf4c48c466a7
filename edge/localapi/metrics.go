package localapi

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests     *prometheus.CounterVec
	online       prometheus.Gauge
	transitions  *prometheus.CounterVec
	records      prometheus.Gauge
	corrupt      prometheus.Counter
	writes       *prometheus.CounterVec
	writtenBytes prometheus.Counter
	writeErrors  prometheus.Counter
	heldWatches  prometheus.Gauge
	expired      prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "requests_total",
			Help: "Requests of the node's components, by component, verb (read, watch, token, write) and who answered (apiserver, cache, refused).",
		}, []string{"component", "verb", "answer"}),
		online: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "apiserver_reachable",
			Help: "1 while kube-apiserver answers the probe, 0 while requests are answered from the cache.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "transitions_total",
			Help: "Changes between reaching kube-apiserver and answering from the cache, by the new state (online, offline).",
		}, []string{"to"}),
		records: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_records",
			Help: "Answers kept (lists, objects, tokens) across every component.",
		}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_records_corrupt_total",
			Help: "Records on disk that did not load at start (removed, fetched again online).",
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_writes_total",
			Help: "Records written to disk (or removed), by component and resource (nodes, pods, serviceaccounts/token, …).",
		}, []string{"component", "resource"}),
		writtenBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_written_bytes_total",
			Help: "Bytes of the records written to disk.",
		}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_write_errors_total",
			Help: "Flushes that could not write every changed record (kept in memory, tried again).",
		}),
		heldWatches: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "held_watches",
			Help: "Watches answered from the cache, held open until kube-apiserver is reachable again.",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "localapi", Name: "cache_records_expired_total",
			Help: "Records dropped because no component asked for them for the retention (--retain).",
		}),
	}
	reg.MustRegister(m.requests, m.online, m.transitions, m.records, m.corrupt, m.writes, m.writtenBytes, m.writeErrors, m.heldWatches, m.expired)
	return m
}
