package natsnode

import "github.com/prometheus/client_golang/prometheus"

// collector exports the edge server's links and traffic.
type collector struct {
	n                                  *Node
	routes, hub, hubServer, rotations  *prometheus.Desc
	inMsgs, outMsgs, inBytes, outBytes *prometheus.Desc
}

func newCollector(n *Node) *collector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("atoll", "natsnode", name), help, nil, nil)
	}
	return &collector{
		n:      n,
		routes: d("routed_peers", "Unit peers this node's server has routes to."),
		hub:    d("hub_connected", "1 while the leaf link to the hub is up."),
		hubServer: prometheus.NewDesc("atoll_natsnode_hub_server", "1 for the hub server the leaf link is on (absent while the link is down).",
			[]string{"server"}, nil),
		rotations: d("route_credential_rotations_total",
			"Route credential changes within the node's unit applied since the server started (the cloud rotates them when a member leaves)."),
		inMsgs:   d("in_msgs_total", "Messages received by the node's server."),
		outMsgs:  d("out_msgs_total", "Messages sent by the node's server."),
		inBytes:  d("in_bytes_total", "Bytes received by the node's server."),
		outBytes: d("out_bytes_total", "Bytes sent by the node's server."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.routes, c.hub, c.hubServer, c.rotations, c.inMsgs, c.outMsgs, c.inBytes, c.outBytes} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.n.Status()
	up := 0.0
	if st.HubConnected {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.routes, prometheus.GaugeValue, float64(len(st.RoutedPeers)))
	ch <- prometheus.MustNewConstMetric(c.hub, prometheus.GaugeValue, up)
	if st.HubServer != "" {
		ch <- prometheus.MustNewConstMetric(c.hubServer, prometheus.GaugeValue, 1, st.HubServer)
	}
	ch <- prometheus.MustNewConstMetric(c.rotations, prometheus.CounterValue, float64(st.RouteRotations))
	if v, err := c.n.srv.Varz(nil); err == nil {
		ch <- prometheus.MustNewConstMetric(c.inMsgs, prometheus.CounterValue, float64(v.InMsgs))
		ch <- prometheus.MustNewConstMetric(c.outMsgs, prometheus.CounterValue, float64(v.OutMsgs))
		ch <- prometheus.MustNewConstMetric(c.inBytes, prometheus.CounterValue, float64(v.InBytes))
		ch <- prometheus.MustNewConstMetric(c.outBytes, prometheus.CounterValue, float64(v.OutBytes))
	}
}
