package eventbus

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Termination reasons, the reason label of atoll_events_terminated_total.
const (
	ReasonUndecodable   = "undecodable"
	ReasonWrongType     = "wrong_type"
	ReasonIdentity      = "identity"
	ReasonRejected      = "rejected"
	ReasonMaxDeliveries = "max_deliveries"
	ReasonFailed        = "failed" // a core NATS handler failed: nothing redelivers it
)

// Outcomes, the outcome label of atoll_events_handled_total.
const (
	OutcomeAck   = "ack"
	OutcomeRetry = "retry"
	OutcomeTerm  = "term"
	// OutcomeSeen: acked without decoding, handled elsewhere already
	// (ConsumeOptions.Seen).
	OutcomeSeen = "seen"
)

// Metrics counts what consumers and subscriptions did with each message,
// and how their consumers fare. The consumer label is the spec's name (or
// the subscription's name).
type Metrics struct {
	handled    *prometheus.CounterVec
	terminated *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	restarts   *prometheus.CounterVec
	up         *prometheus.GaugeVec
	caughtUp   *prometheus.GaugeVec
}

// NewMetrics registers the event metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "handled_total",
			Help: "Messages handled, by consumer and outcome (ack, retry, term; seen: acked undecoded, handled by another consumer of the process already).",
		}, []string{"consumer", "outcome"}),
		terminated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "terminated_total",
			Help: "Messages ended for good (terminated on the server, or dropped), by consumer and reason.",
		}, []string{"consumer", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "events", Name: "handle_seconds",
			Help:    "Time to decode and handle one message, retries in place included, by consumer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"consumer"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "consumer_restarts_total",
			Help: "Consumers lost or not reachable and (re)created, by consumer and reason (lost, closed, unreachable).",
		}, []string{"consumer", "reason"}),
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "events", Name: "consumer_up",
			Help: "1 while the consumer exists and is consuming, by consumer.",
		}, []string{"consumer"}),
		caughtUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "events", Name: "consumer_caught_up",
			Help: "1 once the consumer has handled what its stream held when it started, by consumer.",
		}, []string{"consumer"}),
	}
	if reg != nil {
		reg.MustRegister(m.handled, m.terminated, m.duration, m.restarts, m.up, m.caughtUp)
	}
	return m
}

// RestartCount is how many times consumer was recreated for reason.
func (m *Metrics) RestartCount(consumer, reason string) float64 {
	return counterValue(m.restarts.WithLabelValues(consumer, reason))
}

// Up is the consumer_up gauge of consumer.
func (m *Metrics) Up(consumer string) float64 {
	var d dto.Metric
	if err := m.up.WithLabelValues(consumer).Write(&d); err != nil {
		return 0
	}
	return d.GetGauge().GetValue()
}

// TerminatedCount is how many messages consumer terminated for reason.
func (m *Metrics) TerminatedCount(consumer, reason string) float64 {
	return counterValue(m.terminated.WithLabelValues(consumer, reason))
}

// HandledCount is how many messages consumer handled with outcome.
func (m *Metrics) HandledCount(consumer, outcome string) float64 {
	return counterValue(m.handled.WithLabelValues(consumer, outcome))
}

func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
