package tunnel

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/events/tunnel"
)

// Metrics of the tunnel agent (subsystem tunnel_agent). A nil *Metrics
// records nothing.
type Metrics struct {
	sessions     prometheus.Gauge
	ended        *prometheus.CounterVec
	bytes        *prometheus.CounterVec
	resent       prometheus.Counter
	refusedTotal prometheus.Counter
	dialFailures prometheus.Counter
}

// NewMetrics registers the agent's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sessions:     prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "sessions", Help: "Live tunnel sessions relayed to local targets."}),
		ended:        prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "sessions_ended_total", Help: "Tunnel sessions ended, by result (ok, error)."}, []string{"result"}),
		bytes:        prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "bytes_total", Help: "Stream bytes relayed, by direction (in: from the cloud, out: to the cloud)."}, []string{"dir"}),
		resent:       prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "frames_resent_total", Help: "Tunnel frames resent for want of an acknowledgement."}),
		refusedTotal: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "refused_targets_total", Help: "Sessions refused because their target is not allow-listed."}),
		dialFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "dial_failures_total", Help: "Sessions whose allow-listed target could not be dialled."}),
	}
	reg.MustRegister(m.sessions, m.ended, m.bytes, m.resent, m.refusedTotal, m.dialFailures)
	return m
}

func (m *Metrics) refused() {
	if m != nil {
		m.refusedTotal.Inc()
	}
}

func (m *Metrics) dialFailed() {
	if m != nil {
		m.dialFailures.Inc()
	}
}

func (m *Metrics) relaying(delta float64) {
	if m != nil {
		m.sessions.Add(delta)
	}
}

// done accounts a session's end.
func (m *Metrics) done(st tunnel.Stats, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.ended.WithLabelValues(result).Inc()
	m.bytes.WithLabelValues("in").Add(float64(st.BytesReceived))
	m.bytes.WithLabelValues("out").Add(float64(st.BytesSent))
	m.resent.Add(float64(st.FramesResent))
}
