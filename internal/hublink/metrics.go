package hublink

import "github.com/prometheus/client_golang/prometheus"

// collector exports the link's state: connected or not, and how often it
// had to reconnect.
type collector struct {
	l                     *Link
	connected, reconnects *prometheus.Desc
}

// Collector returns the link's metrics (atoll_hublink_connected,
// atoll_hublink_reconnects_total), labelled with conn.
func (l *Link) Collector(conn string) prometheus.Collector {
	labels := prometheus.Labels{"conn": conn}
	return &collector{
		l:          l,
		connected:  prometheus.NewDesc("atoll_hublink_connected", "1 while the link to the hub is connected.", nil, labels),
		reconnects: prometheus.NewDesc("atoll_hublink_reconnects_total", "Times the link to the hub reconnected.", nil, labels),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) { ch <- c.connected; ch <- c.reconnects }

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	nc := c.l.Conn()
	up, reconnects := 0.0, 0.0
	if nc != nil {
		if nc.IsConnected() {
			up = 1
		}
		reconnects = float64(nc.Stats().Reconnects)
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, up)
	ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, reconnects)
}
