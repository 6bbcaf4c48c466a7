package identity

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestViolationsByNode: a connection cut off for a protocol violation is
// counted under the node its credentials name and logged at once; more
// from the same node within a minute are counted and summed up in one
// line; other disconnects and credentials Atoll did not issue are not.
func TestViolationsByNode(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	m := NewMetrics(prometheus.NewRegistry())
	v := &violations{log: slog.New(slog.NewTextHandler(&buf, nil)), metrics: m, now: func() time.Time { return now }}
	ev := func(reason string, tags ...string) server.DisconnectEventMsg {
		var e server.DisconnectEventMsg
		e.Reason, e.Client.Kind, e.Client.ID, e.Client.Tags = reason, "Leafnode", 7, jwt.TagList(tags)
		e.Server.Name = "hub-0"
		return e
	}
	violation := server.ProtocolViolation.String()
	v.handle(ev(violation, "role:edge", "name:a"))
	v.handle(ev(violation, "role:edge", "name:a"))
	v.handle(ev(violation, "role:edge", "name:b"))
	v.handle(ev(server.StaleConnection.String(), "role:edge", "name:c"))
	v.handle(ev(violation)) // not Atoll's credentials

	for node, want := range map[string]float64{"a": 2, "b": 1, "c": 0} {
		if got := testutil.ToFloat64(m.violations.WithLabelValues("edge", node)); got != want {
			t.Errorf("node %s: %v violations counted, want %v", node, got, want)
		}
	}
	if got := testutil.CollectAndCount(m.violations); got != 3 { // a, b and c's zero just read
		t.Errorf("%d series, want 3", got)
	}
	logged := func(node string) int { return strings.Count(buf.String(), "node="+node+" ") }
	if logged("a") != 1 || logged("b") != 1 || logged("c") != 0 {
		t.Errorf("logged a %d, b %d, c %d times, want 1, 1, 0:\n%s", logged("a"), logged("b"), logged("c"), buf.String())
	}
	if !strings.Contains(buf.String(), "cid=7") || !strings.Contains(buf.String(), "server=hub-0") {
		t.Errorf("the line does not name the server and connection id:\n%s", buf.String())
	}

	now = now.Add(violationLogEvery)
	v.flush("a") // as a's timer does
	if !strings.Contains(buf.String(), "node=a cut_off=1") {
		t.Errorf("the second cut-off of a is not summed up:\n%s", buf.String())
	}
	now = now.Add(violationLogEvery)
	v.handle(ev(violation, "role:edge", "name:a"))
	if logged("a") != 3 {
		t.Errorf("a cut off a minute after its last line: logged %d times, want 3:\n%s", logged("a"), buf.String())
	}
}
