// Package docs holds the documentation that tests check against the code:
// it embeds reference/metrics.md, the table of every metric Atoll exports,
// keeps the generated blocks of the other reference pages (Block,
// SyncBlock), and its tests check that every relative link of the
// repository's Markdown resolves.
package docs

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

//go:embed reference/metrics.md
var metricsMD string

// Metric is one row of reference/metrics.md.
type Metric struct {
	Name     string   // e.g. atoll_health_protected_nodes
	Type     string   // counter, gauge, histogram
	Labels   []string // variable labels, sorted as written
	Services []string // atoll-cloud, atoll-edge
}

var (
	rowRE  = regexp.MustCompile("^\\|\\s*`(atoll_[a-z0-9_]+)`\\s*\\|")
	codeRE = regexp.MustCompile("`([a-z_]+)`")
)

// Metrics parses the table rows of reference/metrics.md: | `name` | type | labels |
// meaning | services |.
func Metrics() (map[string]Metric, error) { return parseMetrics(metricsMD) }

func parseMetrics(md string) (map[string]Metric, error) {
	out := map[string]Metric{}
	for i, line := range strings.Split(md, "\n") {
		if !rowRE.MatchString(line) {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 5 {
			return nil, fmt.Errorf("docs/reference/metrics.md:%d: %d cells, want 5 (name, type, labels, meaning, services)", i+1, len(cells))
		}
		m := Metric{Name: rowRE.FindStringSubmatch(line)[1], Type: strings.TrimSpace(cells[1])}
		switch m.Type {
		case "counter", "gauge", "histogram":
		default:
			return nil, fmt.Errorf("docs/reference/metrics.md:%d: %s: type %q", i+1, m.Name, m.Type)
		}
		for _, l := range codeRE.FindAllStringSubmatch(cells[2], -1) {
			m.Labels = append(m.Labels, l[1])
		}
		for _, s := range strings.Split(cells[4], ",") {
			if s = strings.TrimSpace(s); s != "" {
				m.Services = append(m.Services, s)
			}
		}
		if _, dup := out[m.Name]; dup {
			return nil, fmt.Errorf("docs/reference/metrics.md:%d: %s listed twice", i+1, m.Name)
		}
		out[m.Name] = m
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("docs/reference/metrics.md: no metric rows")
	}
	return out, nil
}

// Series reports whether a PromQL series name belongs to metric m: the
// name itself, or a histogram's _bucket, _sum and _count series.
func Series(metrics map[string]Metric, series string) (Metric, bool) {
	if m, ok := metrics[series]; ok {
		return m, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok {
			if m, ok := metrics[base]; ok && m.Type == "histogram" {
				return m, true
			}
		}
	}
	return Metric{}, false
}
