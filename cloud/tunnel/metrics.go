package tunnel

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/events/tunnel"
)

// Metrics of the tunnel server (subsystem tunnel_server). A nil *Metrics
// records nothing.
type Metrics struct {
	sessions *prometheus.GaugeVec
	opens    *prometheus.CounterVec
	ended    *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	resent   prometheus.Counter
}

// NewMetrics registers the server's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "sessions", Help: "Live tunnel sessions this replica relays."}, nil),
		opens:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "session_opens_total", Help: "Session opens, by result (ok; refused: the agent refused the target or could not dial it; unknown_node; timeout)."}, []string{"result"}),
		ended:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "sessions_ended_total", Help: "Sessions ended, by result (ok, error)."}, []string{"result"}),
		bytes:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "bytes_total", Help: "Stream bytes relayed, by direction (to_edge, from_edge)."}, []string{"dir"}),
		resent:   prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "frames_resent_total", Help: "Tunnel frames resent for want of an acknowledgement."}),
	}
	reg.MustRegister(m.sessions, m.opens, m.ended, m.bytes, m.resent)
	return m
}

func (m *Metrics) opened() {
	if m != nil {
		m.opens.WithLabelValues("ok").Inc()
		m.sessions.WithLabelValues().Inc()
	}
}

func (m *Metrics) closed() {
	if m != nil {
		m.sessions.WithLabelValues().Dec()
	}
}

func (m *Metrics) unknownNode() {
	if m != nil {
		m.opens.WithLabelValues("unknown_node").Inc()
	}
}

func (m *Metrics) failed(err error) {
	if m == nil {
		return
	}
	var pe *tunnel.PeerError
	switch {
	case errors.As(err, &pe):
		m.opens.WithLabelValues("refused").Inc()
	default:
		m.opens.WithLabelValues("timeout").Inc()
	}
}

func (m *Metrics) done(st tunnel.Stats, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.ended.WithLabelValues(result).Inc()
	m.bytes.WithLabelValues("to_edge").Add(float64(st.BytesSent))
	m.bytes.WithLabelValues("from_edge").Add(float64(st.BytesReceived))
	m.resent.Add(float64(st.FramesResent))
}
