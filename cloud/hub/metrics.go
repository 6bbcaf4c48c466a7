package hub

import (
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the hub server's connection and traffic counters.
type collector struct {
	h                                  *Hub
	clients, leafs, subs               *prometheus.Desc
	inMsgs, outMsgs, inBytes, outBytes *prometheus.Desc
	jsBytes, jsAPIErrors               *prometheus.Desc
	violations                         *prometheus.Desc
}

func newCollector(h *Hub) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("atoll", "hub", name), help, nil, nil)
	}
	return &collector{
		h:           h,
		clients:     d("clients", "Client connections (cloud services, operators)."),
		leafs:       d("leafnodes", "Leaf connections (edge nodes)."),
		subs:        d("subscriptions", "Subscriptions on the hub."),
		inMsgs:      d("in_msgs_total", "Messages received by the hub."),
		outMsgs:     d("out_msgs_total", "Messages sent by the hub."),
		inBytes:     d("in_bytes_total", "Bytes received by the hub."),
		outBytes:    d("out_bytes_total", "Bytes sent by the hub."),
		jsBytes:     d("jetstream_store_bytes", "Bytes stored by JetStream on disk."),
		jsAPIErrors: d("jetstream_api_errors_total", "JetStream API requests that failed."),
		violations:  d("permission_violations_total", "Publications and subscriptions the server refused because the connection's permissions do not allow them."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.clients, c.leafs, c.subs, c.inMsgs, c.outMsgs, c.inBytes, c.outBytes, c.jsBytes, c.jsAPIErrors, c.violations} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	v, err := c.h.srv.Varz(&server.VarzOptions{})
	if err != nil {
		return
	}
	gauge := func(d *prometheus.Desc, x float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x) }
	count := func(d *prometheus.Desc, x float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, x)
	}
	gauge(c.clients, float64(v.Connections))
	gauge(c.leafs, float64(v.Leafs))
	gauge(c.subs, float64(v.Subscriptions))
	count(c.inMsgs, float64(v.InMsgs))
	count(c.outMsgs, float64(v.OutMsgs))
	count(c.inBytes, float64(v.InBytes))
	count(c.outBytes, float64(v.OutBytes))
	count(c.violations, float64(c.h.Violations()))
	if st := v.JetStream.Stats; st != nil {
		gauge(c.jsBytes, float64(st.Store))
		count(c.jsAPIErrors, float64(st.API.Errors))
	}
}
