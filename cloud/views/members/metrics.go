package members

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	nodes, units                    prometheus.Gauge
	published, repaired, duplicates prometheus.Counter
	conflicts, rotations            prometheus.Counter
	incremental                     prometheus.Counter
	rejected                        *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "members", Name: "nodes",
			Help: "Edge nodes known from their topology reports.",
		}),
		units: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "members", Name: "units",
			Help: "Units with at least one member.",
		}),
		incremental: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "incremental_passes_total",
			Help: "Recomputes of only the views the changed nodes touch (their assignments and units), instead of every view.",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "views_published_total",
			Help: "Unit views and node assignments published because the stream did not hold their content.",
		}),
		repaired: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "views_repaired_total",
			Help: "Views republished by a resync because the stream had lost or replaced content already published.",
		}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "views_duplicate_republished_total",
			Help: "Views the hub acknowledged as duplicates of a copy it no longer held, published again under a new id.",
		}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "views_conflicts_total",
			Help: "Publishes refused because the subject's last stored value was not the one read (another replica's, or lost by the hub); the stream is read again.",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "views_rejected_total",
			Help: "Inputs left out of a view (route_url, internal_ip, node_key: once per bad value) and views not published (too_large, publish_failed, route_secret: per attempt).",
		}, []string{"reason"}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "members", Name: "route_secret_rotations_total",
			Help: "Unit route passwords replaced by this replica because a member left the unit (or the stored entry did not decode).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.nodes, m.units, m.published, m.repaired, m.duplicates, m.conflicts, m.rejected, m.rotations, m.incremental)
	}
	return m
}

// behindCollector exports atoll_members_agents_behind{view}: the agents
// whose last report shows a view older than the one published (see
// ViewsBehind), computed at each scrape.
type behindCollector struct {
	s    *Service
	desc *prometheus.Desc
}

// AgentsBehind returns the collector of atoll_members_agents_behind for s.
func (s *Service) AgentsBehind() prometheus.Collector {
	return &behindCollector{s: s, desc: prometheus.NewDesc("atoll_members_agents_behind",
		"Edge agents whose last topology report shows an older assignment or unit view than the one published (view: assignment, unit_view), or no fingerprints (view: unknown).",
		[]string{"view"}, nil)}
}

func (c *behindCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *behindCollector) Collect(ch chan<- prometheus.Metric) {
	counts := map[string]float64{"assignment": 0, "unit_view": 0, "unknown": 0}
	c.s.mu.Lock()
	names := make([]string, 0, len(c.s.nodes))
	for name := range c.s.nodes {
		names = append(names, name)
	}
	c.s.mu.Unlock()
	for _, name := range names {
		for _, v := range strings.Split(c.s.ViewsBehind(name), ", ") {
			switch v {
			case BehindAssignment:
				counts["assignment"]++
			case BehindUnitView:
				counts["unit_view"]++
			case BehindUnknown:
				counts["unknown"]++
			}
		}
	}
	for view, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, n, view)
	}
}
