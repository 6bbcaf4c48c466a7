package tunnel

import (
	"log/slog"
	"strings"
	"testing"
)

func TestTarget(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Allow = []string{"127.0.0.1:9100"}
	a, err := New(cfg, "n1", nil, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		requested, dial, err string
	}{
		{"10.0.0.7:10250", "127.0.0.1:10250", ""},
		{"n1:10250", "127.0.0.1:10250", ""},
		{"n1:9100", "127.0.0.1:9100", ""},
		{"169.254.169.254:80", "", `target "169.254.169.254:80" not allowed on node n1`},
		{"n1:22", "", "not allowed"},
		{"n1", "", "missing port"},
		{"n1:99999", "", "bad port"},
	}
	for _, tt := range tests {
		t.Run(tt.requested, func(t *testing.T) {
			got, err := a.Target(tt.requested)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.dial {
				t.Fatalf("got %q %v, want %q", got, err, tt.dial)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		err  string
	}{
		{"default", func(*Config) {}, ""},
		{"disabled ignores the rest", func(c *Config) { c.Enabled, c.Kubelet = false, "junk" }, ""},
		{"bad kubelet", func(c *Config) { c.Kubelet = "nohost" }, `allowed target "nohost"`},
		{"bad allow", func(c *Config) { c.Allow = []string{"x:0"} }, `allowed target "x:0"`},
		{"backlog", func(c *Config) { c.Backlog = 0 }, "Backlog"},
		{"session", func(c *Config) { c.Session.Window = 10 }, "Window"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			if (tt.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
		})
	}
}
