package monitoring_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/deploy/monitoring"
	"github.com/atoll-edge/atoll/docs"
)

// metricName is how a PromQL expression names an Atoll series.
var metricName = regexp.MustCompile(`\batoll_[a-z0-9_]+`)

// unknownMetrics returns the atoll_* names of expr that are not series of
// a metric in docs/reference/metrics.md (a histogram's _bucket, _sum and _count
// are).
func unknownMetrics(table map[string]docs.Metric, expr string) []string {
	var out []string
	for _, n := range metricName.FindAllString(expr, -1) {
		if _, ok := docs.Series(table, n); !ok {
			out = append(out, n)
		}
	}
	return out
}

type rulesFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

type target struct {
	Expr string `json:"expr"`
}

type panel struct {
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []target                 `json:"targets"`
}

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := monitoring.Read("atoll-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("atoll-dashboard.json: %v", err)
	}
	return d
}

// dashboardExprs returns every PromQL expression of the dashboard by
// where it is (panel title or variable).
func dashboardExprs(d dashboard) map[string][]string {
	out := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			out["panel "+p.Title] = append(out["panel "+p.Title], tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			_ = json.Unmarshal(v.Query, &q.Query)
		}
		out["variable "+v.Name] = append(out["variable "+v.Name], q.Query)
	}
	return out
}

// TestRulesAndDashboardNameTableMetrics: the alerting rules and the
// dashboard query only metrics docs/reference/metrics.md lists (which
// TestMetricsTable in test/e2e checks against the services).
func TestRulesAndDashboardNameTableMetrics(t *testing.T) {
	table, err := docs.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	// The check can fail.
	if got := unknownMetrics(table, `rate(atoll_nope_total[5m]) + atoll_health_protected_nodes_bucket`); !slices.Equal(got, []string{"atoll_nope_total", "atoll_health_protected_nodes_bucket"}) {
		t.Fatalf("unknownMetrics found %v", got)
	}

	data, err := monitoring.Read("atoll-alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rf rulesFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("atoll-alerts.yaml: %v", err)
	}
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts++
			if bad := unknownMetrics(table, r.Expr); len(bad) > 0 {
				t.Errorf("alert %s queries %v, not in docs/reference/metrics.md", r.Alert, bad)
			}
			if !strings.Contains(r.Expr, "atoll_") && !strings.Contains(r.Expr, `up{job="atoll-`) {
				t.Errorf("alert %s queries no Atoll metric: %s", r.Alert, r.Expr)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
		}
	}
	if alerts < 6 {
		t.Fatalf("only %d alerts in atoll-alerts.yaml", alerts)
	}

	exprs := dashboardExprs(readDashboard(t))
	if len(exprs) < 20 {
		t.Fatalf("only %d panels and variables with queries in atoll-dashboard.json", len(exprs))
	}
	for where, es := range exprs {
		for _, e := range es {
			if strings.TrimSpace(e) == "" {
				t.Errorf("dashboard %s: empty query", where)
			}
			if bad := unknownMetrics(table, e); len(bad) > 0 {
				t.Errorf("dashboard %s queries %v, not in docs/reference/metrics.md", where, bad)
			}
		}
	}
}

// TestDashboardModel: the dashboard is a Grafana JSON model whose panels
// take the data source from the DS_PROMETHEUS variable, do not overlap,
// and cover what an operator looks at.
func TestDashboardModel(t *testing.T) {
	d := readDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Fatalf("title %q, uid %q", d.Title, d.UID)
	}
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Name == "DS_PROMETHEUS" && v.Type == "datasource" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no datasource variable DS_PROMETHEUS")
	}
	type cell struct{ x, y int }
	used := map[cell]string{}
	for _, p := range d.Panels {
		if p.Type != "row" {
			if p.Datasource == nil || p.Datasource.UID != "${DS_PROMETHEUS}" {
				t.Errorf("panel %q: datasource %+v, want uid ${DS_PROMETHEUS}", p.Title, p.Datasource)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
		}
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := used[cell{x, y}]; ok {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				used[cell{x, y}] = p.Title
			}
		}
	}
	all := fmt.Sprint(dashboardExprs(d))
	for _, m := range []string{"atoll_health_unit_disruption", "atoll_health_protected_nodes", "atoll_prober_round_seconds_bucket",
		"atoll_voter_ballots_published_total", "atoll_events_consumer_up", "atoll_viewfeed_behind_seconds", "atoll_health_patches_total",
		"atoll_webhook_requests_total", "atoll_tunnel_server_sessions", "atoll_tunnel_server_bytes_total", "atoll_proxy_view_bytes_total"} {
		if !strings.Contains(all, m) {
			t.Errorf("no panel queries %s", m)
		}
	}
}

// grafanaVars are the dashboard's variables with a value PromQL parses.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$unit", ".*")

// TestDashboardQueriesParse: every query of the dashboard is valid PromQL,
// checked by promtool as recording rules (go tool task monitoring:deps
// installs it).
func TestDashboardQueriesParse(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (go tool task monitoring:deps)")
	}
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	n := 0
	for _, es := range dashboardExprs(readDashboard(t)) {
		for _, e := range es {
			if strings.HasPrefix(e, "label_values(") {
				continue // a Grafana function, not PromQL
			}
			q, _ := json.Marshal(grafanaVars.Replace(e))
			fmt.Fprintf(&b, "      - record: dashboard:q%d\n        expr: %s\n", n, q)
			n++
		}
	}
	check := func(rules string) ([]byte, error) {
		p := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(p, []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
		return exec.Command(promtool, "check", "rules", p).CombinedOutput()
	}
	if out, err := check(b.String()); err != nil {
		t.Fatalf("promtool check rules on the dashboard's %d queries: %v\n%s", n, err, out)
	}
	// The check can fail.
	if out, err := check("groups:\n  - name: bad\n    rules:\n      - record: bad:q\n        expr: 'sum(rate(atoll_x[5m])'\n"); err == nil {
		t.Fatalf("promtool accepted broken PromQL:\n%s", out)
	}
}
