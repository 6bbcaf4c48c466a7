// Package monitoring holds Atoll's Prometheus alerting rules
// (atoll-alerts.yaml, unit-tested by promtool with atoll-alerts.test.yaml),
// its Grafana dashboard (atoll-dashboard.json) and an example scrape
// configuration (scrape.yaml), embedded so that the tests check them
// against docs/reference/metrics.md.
package monitoring

import "embed"

//go:embed atoll-alerts.yaml atoll-dashboard.json scrape.yaml
var files embed.FS

// Read returns one file's content, e.g. "atoll-alerts.yaml".
func Read(name string) ([]byte, error) { return files.ReadFile(name) }
