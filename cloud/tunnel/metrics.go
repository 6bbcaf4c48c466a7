package tunnel

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// Metrics of the tunnel server (subsystem tunnel_server). A nil *Metrics
// records nothing.
type Metrics struct {
	sessions *prometheus.GaugeVec
	opens    *prometheus.CounterVec
	ended    *prometheus.CounterVec
	bytes    *prometheus.CounterVec
	resent   prometheus.Counter
	relayedN prometheus.Counter
	switches *prometheus.CounterVec
	rframes  *prometheus.CounterVec
	api      *prometheus.CounterVec
}

// NewMetrics registers the server's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		sessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "sessions", Help: "Live tunnel sessions this replica relays."}, nil),
		opens:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "session_opens_total", Help: "Session opens, by result (ok; refused: the agent refused the target or could not dial it; unknown_node; unreachable: the node's link is down and no unit peer can relay; timeout)."}, []string{"result"}),
		ended:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "sessions_ended_total", Help: "Sessions ended, by result (ok, error)."}, []string{"result"}),
		bytes:    prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "bytes_total", Help: "Stream bytes relayed, by direction (to_edge, from_edge)."}, []string{"dir"}),
		resent:   prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "frames_resent_total", Help: "Tunnel frames resent for want of an acknowledgement."}),
	}
	m.relayedN = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "relayed_sessions_total", Help: "Sessions that went through a unit peer of their node (its own leaf link down or silent)."})
	m.switches = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "path_switches_total", Help: "Sessions moved to another path, by where to (peer, direct)."}, []string{"to"})
	m.rframes = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "relay_frames_total", Help: "Tunnel frames through a relaying unit peer, by direction (to_edge, from_edge)."}, []string{"dir"})
	m.api = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_server", Name: "apiserver_connections_total", Help: "Nodes' requests for a connection to kube-apiserver (--apiserver-via=hub), by result (ok; bad_request; over_limit: the node holds --tunnel-apiserver-per-node; apiserver_unreachable; session_failed: the node's agent did not take the session; unanswered: the agent stopped waiting)."}, []string{"result"})
	reg.MustRegister(m.sessions, m.opens, m.ended, m.bytes, m.resent, m.relayedN, m.switches, m.rframes, m.api)
	return m
}

func (m *Metrics) relayed() {
	if m != nil {
		m.relayedN.Inc()
	}
}

func (m *Metrics) switched(via string) {
	if m == nil {
		return
	}
	to := "peer"
	if via == "" {
		to = "direct"
	}
	m.switches.WithLabelValues(to).Inc()
}

func (m *Metrics) relayFrame(dir events.TunnelDir) {
	if m == nil {
		return
	}
	if dir == events.ToEdge {
		m.rframes.WithLabelValues("to_edge").Inc()
	} else {
		m.rframes.WithLabelValues("from_edge").Inc()
	}
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

func (m *Metrics) unreachable() {
	if m != nil {
		m.opens.WithLabelValues("unreachable").Inc()
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
	var pe *tunnelproto.PeerError
	switch {
	case errors.As(err, &pe):
		m.opens.WithLabelValues("refused").Inc()
	default:
		m.opens.WithLabelValues("timeout").Inc()
	}
}

func (m *Metrics) done(st tunnelproto.Stats, err error) {
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

func (m *Metrics) apiServer(result string) {
	if m != nil {
		m.api.WithLabelValues(result).Inc()
	}
}
