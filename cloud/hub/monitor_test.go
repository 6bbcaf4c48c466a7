package hub_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/test/freeport"
	"github.com/atoll-edge/atoll/test/natstest"
)

// TestMonitor: with MonitorAddr the hub serves nats-server's monitoring
// there (JetStream's state at /jsz); a bad address is refused by name.
func TestMonitor(t *testing.T) {
	port, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	natstest.Hub(t, func(c *hub.Config) { c.MonitorAddr = addr })
	resp, err := http.Get("http://" + addr + "/jsz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var jsz server.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&jsz); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/jsz: %d %v", resp.StatusCode, err)
	}
	if jsz.Config.Domain == "" {
		t.Errorf("/jsz without the JetStream domain: %+v", jsz.Config)
	}
	cfg := hub.Default()
	cfg.MonitorAddr = "8222"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "monitor address") {
		t.Errorf("monitor address 8222: %v", err)
	}
}
