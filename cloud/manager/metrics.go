package manager

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// bridge re-exports controller-runtime's metrics (workqueue, reconcile,
// leader election, webhook, client-go's REST client), which its packages
// register on their own global registry at init, on the service's
// registry, so one /metrics (internal/admin) serves both. The Go and
// process collectors are the service registry's own.
type bridge struct{ from prometheus.Gatherer }

// RegisterMetrics adds controller-runtime's metrics to reg.
func RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(bridge{from: ctrlmetrics.Registry})
}

// Describe sends nothing: the bridge is an unchecked collector, since the
// families appear as controllers start.
func (bridge) Describe(chan<- *prometheus.Desc) {}

// Collect gathers the families and sends each sample as it is.
func (b bridge) Collect(ch chan<- prometheus.Metric) {
	families, err := b.from.Gather()
	if err != nil && len(families) == 0 {
		return
	}
	for _, f := range families {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName())
			}
			ch <- sample{desc: prometheus.NewDesc(name, f.GetHelp(), labels, nil), m: m}
		}
	}
}

// sample is one gathered metric, written back unchanged.
type sample struct {
	desc *prometheus.Desc
	m    *dto.Metric
}

func (s sample) Desc() *prometheus.Desc { return s.desc }

func (s sample) Write(out *dto.Metric) error {
	proto.Merge(out, s.m)
	return nil
}

// managerMetrics are the manager's own: leadership by terms.
type managerMetrics struct {
	leading prometheus.Gauge
	lost    prometheus.Counter
}

func newManagerMetrics() managerMetrics {
	return managerMetrics{
		leading: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "atoll", Subsystem: "manager", Name: "leading",
			Help: "1 while this replica holds the leader Lease (it writes to Kubernetes).",
		}),
		lost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "manager", Name: "leases_lost_total",
			Help: "Terms that ended because a renewal of the leader Lease missed its deadline (an apiserver slow or unreachable); the replica follows and campaigns again.",
		}),
	}
}

// register adds the manager's own metrics to reg.
func (mm managerMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{mm.leading, mm.lost} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
