package viewfeed

import "github.com/prometheus/client_golang/prometheus"

// Catch-up reasons, the reason label of atoll_viewfeed_catchups_total.
const (
	ReasonStart        = "start"         // the feed started (from the handler's cursor)
	ReasonReconnect    = "reconnect"     // the node's leaf link to the hub came back
	ReasonGap          = "gap"           // a view's previous sequence was never seen
	ReasonOutOfOrder   = "out_of_order"  // a view older than one applied, not seen before
	ReasonSlowConsumer = "slow_consumer" // the subscription dropped views
	ReasonPeriodic     = "periodic"      // CheckPeriod passed
	ReasonUnverified   = "unverified"    // MaxUnverified views applied since the last catch-up
	ReasonRebuilt      = "rebuilt"       // a view stored after the last catch-up has a sequence below it
	ReasonSettle       = "settle"        // a catch-up's consumer may have read a replica behind the stream's leader
	ReasonMesh         = "mesh"          // the node lost its route to a member of its unit, which may have relayed views (Relay)
	ReasonRefused      = "refused"       // a view a unit peer relayed was refused (Relay)
	// ReasonPeerReconnect: a unit peer's leaf link changed; views the hub
	// gave it to relay may be lost (Relay).
	ReasonPeerReconnect = "peer_reconnect"
)

var reasons = []string{ReasonStart, ReasonReconnect, ReasonGap, ReasonOutOfOrder, ReasonSlowConsumer, ReasonPeriodic, ReasonUnverified, ReasonRebuilt, ReasonSettle, ReasonMesh, ReasonRefused, ReasonPeerReconnect}

// Where an applied view came from, the via label of
// atoll_viewfeed_applied_total.
const (
	viaCore    = "core"
	viaRelay   = "relay"
	viaCatchUp = "catchup"
)

// Why a view was not applied, the reason label of
// atoll_viewfeed_skipped_total.
const (
	skipSeen    = "seen"    // its sequence was applied already
	skipInvalid = "invalid" // no sequence header, or outside the feed's filter
	skipFailed  = "failed"  // the handler refused it
	skipRefused = "refused" // relayed by a unit peer without the cloud's valid signature, or not admitted
)

// Metrics are the feeds' metrics, shared by every feed of a process
// (label feed).
type Metrics struct {
	catchups      *prometheus.CounterVec
	catchupErrors *prometheus.CounterVec
	consumers     *prometheus.CounterVec
	behind        *prometheus.GaugeVec
	gaps          *prometheus.CounterVec
	applied       *prometheus.CounterVec
	skipped       *prometheus.CounterVec
	relayed       *prometheus.CounterVec
	direct        *prometheus.GaugeVec
}

// NewMetrics registers the feeds' metrics with reg (nil: not exported).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		catchups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "catchups_total",
			Help: "Catch-ups that completed (full, with a short-lived consumer on VIEWS, or ended by a light check of the space's last view), by feed and reason (start, reconnect, gap, out_of_order, slow_consumer, periodic, unverified, rebuilt, settle, mesh, refused, peer_reconnect).",
		}, []string{"feed", "reason"}),
		catchupErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "catchup_errors_total",
			Help: "Catch-ups that failed (hub unreachable, a delivery lost on the way) and are retried with backoff.",
		}, []string{"feed"}),
		consumers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "consumers_total",
			Help: "Short-lived consumers on VIEWS created for catch-ups, by feed and the catch-up's reason: each costs the hub a check against every leaf link's permissions as it is created and as it is dropped.",
		}, []string{"feed", "reason"}),
		behind: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "behind_seconds",
			Help: "How long a catch-up has been due (the feed may have missed a view) without completing, while the leaf link is up; 0 when none is due.",
		}, []string{"feed"}),
		gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "gaps_total",
			Help: "Republished views whose subject's previous sequence the feed never saw (a view lost on the way), each followed by a catch-up.",
		}, []string{"feed"}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "applied_total",
			Help: "Views handed to the feed's handler, by where they came from (core: republished; relay: relayed by an agent of the unit; catchup: the catch-up's consumer).",
		}, []string{"feed", "via"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "skipped_total",
			Help: "Views not applied, by reason: seen (applied already), invalid (no sequence, outside the filter), failed (the handler refused it), refused (relayed by a unit peer without the cloud's valid signature, or not admitted).",
		}, []string{"feed", "reason"}),
		relayed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "relayed_total",
			Help: "Shared views the hub sent this agent for its unit and that it relayed on the unit's routes.",
		}, []string{"feed"}),
		direct: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "viewfeed", Name: "direct",
			Help: "1 while the feed follows the hub's republished views itself: it relays none, or its node lacks a route to a member of its unit (or refused a relayed view in the last 10 min); 0 while it follows the views its unit relays.",
		}, []string{"feed"}),
	}
	if reg != nil {
		reg.MustRegister(m.catchups, m.catchupErrors, m.consumers, m.behind, m.gaps, m.applied, m.skipped, m.relayed, m.direct)
	}
	return m
}

// init creates the series of feed, so dashboards see zeros.
func (m *Metrics) init(feed string) {
	for _, r := range reasons {
		m.catchups.WithLabelValues(feed, r)
		m.consumers.WithLabelValues(feed, r)
	}
	m.catchupErrors.WithLabelValues(feed)
	m.behind.WithLabelValues(feed).Set(0)
	m.gaps.WithLabelValues(feed)
	m.applied.WithLabelValues(feed, viaCore)
	m.applied.WithLabelValues(feed, viaRelay)
	m.applied.WithLabelValues(feed, viaCatchUp)
	m.relayed.WithLabelValues(feed)
	m.direct.WithLabelValues(feed).Set(1)
	for _, r := range []string{skipSeen, skipInvalid, skipFailed, skipRefused} {
		m.skipped.WithLabelValues(feed, r)
	}
}
