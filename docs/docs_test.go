package docs

import (
	"slices"
	"strings"
	"testing"
)

func TestMetricsParses(t *testing.T) {
	m, err := Metrics()
	if err != nil {
		t.Fatal(err)
	}
	got := m["atoll_health_unit_disruption"]
	if got.Type != "gauge" || !slices.Equal(got.Labels, []string{"unit", "state"}) || !slices.Equal(got.Services, []string{"atoll-cloud"}) {
		t.Fatalf("atoll_health_unit_disruption = %+v", got)
	}
	if got := m["atoll_events_handled_total"].Services; !slices.Equal(got, []string{"atoll-cloud", "atoll-edge"}) {
		t.Fatalf("atoll_events_handled_total services = %v", got)
	}
}

func TestBadRowsNamed(t *testing.T) {
	tests := []struct{ md, want string }{
		{"| `atoll_a` | gauge | | a |\n", "metrics.md:1: 4 cells"},
		{"x\n| `atoll_a` | timer | | a | atoll-cloud |\n", "metrics.md:2: atoll_a: type \"timer\""},
		{"| `atoll_a` | gauge | | a | atoll-cloud |\n| `atoll_a` | gauge | | a | atoll-cloud |\n", "atoll_a listed twice"},
		{"| Name | Type |\n", "no metric rows"},
	}
	for _, tt := range tests {
		if _, err := parseMetrics(tt.md); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseMetrics(%q) = %v, want %q", tt.md, err, tt.want)
		}
	}
}

func TestSeries(t *testing.T) {
	m := map[string]Metric{
		"atoll_h_seconds": {Name: "atoll_h_seconds", Type: "histogram"},
		"atoll_g":         {Name: "atoll_g", Type: "gauge"},
	}
	for series, want := range map[string]bool{
		"atoll_h_seconds": true, "atoll_h_seconds_bucket": true, "atoll_h_seconds_sum": true, "atoll_h_seconds_count": true,
		"atoll_g": true, "atoll_g_bucket": false, "atoll_g_total": false, "atoll_x": false,
	} {
		if _, ok := Series(m, series); ok != want {
			t.Errorf("Series(%s) = %v, want %v", series, ok, want)
		}
	}
}
