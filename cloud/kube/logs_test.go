package kube

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestRouteLogs: a klog line (what client-go's reflectors and leader
// election write) arrives in the slog handler as a JSON record.
func TestRouteLogs(t *testing.T) {
	var buf bytes.Buffer
	RouteLogs(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { klog.ClearLogger() })

	klog.InfoS("reflector started", "resource", "nodes")
	klog.Flush()
	var rec map[string]any
	line, _, _ := strings.Cut(buf.String(), "\n")
	if err := json.Unmarshal([]byte(line), &rec); err != nil {
		t.Fatalf("klog output is not a JSON slog record: %q: %v", buf.String(), err)
	}
	if rec["msg"] != "reflector started" || rec["resource"] != "nodes" || rec["component"] != "client-go" {
		t.Fatalf("record %v: want msg, resource and component client-go", rec)
	}
}
