package tunnel

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
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
	relayFrames  *prometheus.CounterVec
	relayRefusal prometheus.Counter
	apiServerN   *prometheus.CounterVec
	reg          prometheus.Registerer
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
	m.relayFrames = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "relay_frames_total", Help: "Tunnel frames of unit peers' sessions relayed by this agent (to_peer: from the cloud to the peer, to_cloud: back), and of this node's own sessions that arrived through a peer (from_peer)."}, []string{"dir"})
	m.relayRefusal = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "relay_refused_total", Help: "Relay requests refused: the node is not a member of this node's unit (or is this node)."})
	m.apiServerN = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "apiserver_connections_total", Help: "Connections to kube-apiserver through the hub (--tunnel-apiserver-listen), by result (ok; no_relay: no atoll-cloud replica has --tunnel-apiserver; failed)."}, []string{"result"})
	m.reg = reg
	reg.MustRegister(m.sessions, m.ended, m.bytes, m.resent, m.refusedTotal, m.dialFailures, m.relayFrames, m.relayRefusal, m.apiServerN)
	return m
}

func (m *Metrics) relayFrame(dir events.TunnelDir) {
	if m == nil {
		return
	}
	if dir == events.ToEdge {
		m.relayFrames.WithLabelValues("to_peer").Inc()
	} else {
		m.relayFrames.WithLabelValues("to_cloud").Inc()
	}
}

func (m *Metrics) relayedIn() {
	if m != nil {
		m.relayFrames.WithLabelValues("from_peer").Inc()
	}
}

func (m *Metrics) relayRefused() {
	if m != nil {
		m.relayRefusal.Inc()
	}
}

// relaySessions exports the count of peers' sessions relayed now.
func (m *Metrics) relaySessions(n func() int) {
	if m == nil {
		return
	}
	_ = m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "atoll", Subsystem: "tunnel_agent", Name: "relay_sessions", Help: "Unit peers' sessions this agent relays now."}, func() float64 { return float64(n()) }))
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
func (m *Metrics) done(st tunnelproto.Stats, err error) {
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

func (m *Metrics) apiServer(err error) {
	if m == nil {
		return
	}
	switch {
	case err == nil:
		m.apiServerN.WithLabelValues("ok").Inc()
	case errors.Is(err, errNoRelay):
		m.apiServerN.WithLabelValues("no_relay").Inc()
	default:
		m.apiServerN.WithLabelValues("failed").Inc()
	}
}
