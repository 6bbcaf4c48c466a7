package events

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
)

// Outcomes, the outcome label of atoll_events_handled_total.
const (
	OutcomeAck   = "ack"
	OutcomeRetry = "retry"
	OutcomeTerm  = "term"
)

// Metrics counts what consumers and subscriptions did with each message.
type Metrics struct {
	handled    *prometheus.CounterVec
	terminated *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	dropped    *prometheus.CounterVec
}

// NewMetrics registers the event metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "handled_total",
			Help: "JetStream messages handled, by consumer and outcome (ack, retry, term).",
		}, []string{"consumer", "outcome"}),
		terminated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "terminated_total",
			Help: "JetStream messages terminated (never redelivered), by consumer and reason.",
		}, []string{"consumer", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "atoll", Subsystem: "events", Name: "handle_seconds",
			Help:    "Time to decode and handle one message, by consumer.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"consumer"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "events", Name: "dropped_total",
			Help: "Core NATS messages dropped by a subscription, by subscription and reason.",
		}, []string{"subscription", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.handled, m.terminated, m.duration, m.dropped)
	}
	return m
}

// TerminatedCount is how many messages consumer terminated for reason.
func (m *Metrics) TerminatedCount(consumer, reason string) float64 {
	return counterValue(m.terminated.WithLabelValues(consumer, reason))
}

// HandledCount is how many messages consumer handled with outcome.
func (m *Metrics) HandledCount(consumer, outcome string) float64 {
	return counterValue(m.handled.WithLabelValues(consumer, outcome))
}

// DroppedCount is how many messages subscription dropped for reason.
func (m *Metrics) DroppedCount(subscription, reason string) float64 {
	return counterValue(m.dropped.WithLabelValues(subscription, reason))
}

func counterValue(c prometheus.Counter) float64 {
	var d dto.Metric
	if err := c.Write(&d); err != nil {
		return 0
	}
	return d.GetCounter().GetValue()
}
