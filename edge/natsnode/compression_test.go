package natsnode_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestHubCompression: the leaf link runs with the mode the edge asks for
// (off, the default, turns it off whatever the hub accepts); s2_auto
// frames a loopback link without compressing it (s2_uncompressed below
// 10 ms); an unknown mode is refused naming the field.
func TestHubCompression(t *testing.T) {
	if got := natsnode.Default().HubCompression; got != "off" {
		t.Fatalf("default compression %q, want off (a compressed leaf costs the hub ~0.5 MiB more)", got)
	}
	h := natstest.Hub(t)
	for _, tc := range []struct{ mode, want string }{
		{"off", server.CompressionOff},
		{"s2_auto", server.CompressionS2Uncompressed},
		{"s2_fast", server.CompressionS2Fast},
	} {
		t.Run("mode="+tc.mode, func(t *testing.T) {
			n := natstest.Edge(t, h, "c"+strings.TrimPrefix(tc.mode, "s2_"), natstest.EdgeOptions{HubCompression: tc.mode})
			poll.Eventually(t, 20*time.Second, func() error {
				lz, err := n.Server().Leafz(nil)
				if err != nil {
					return err
				}
				if len(lz.Leafs) != 1 {
					return fmt.Errorf("%d leaf connections", len(lz.Leafs))
				}
				if got := lz.Leafs[0].Compression; got != tc.want {
					return fmt.Errorf("compression %q, want %q", got, tc.want)
				}
				return nil
			})
		})
	}
	cfg := natsnode.Default()
	cfg.NodeName, cfg.HubURLs, cfg.HubCompression = "n1", []string{"nats-leaf://127.0.0.1:7422"}, "zstd"
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `hub compression "zstd"`) {
		t.Fatalf("Validate with compression zstd: %v", err)
	}
}
