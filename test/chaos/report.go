package chaos

import (
	"cmp"
	"encoding/json"
	"fmt"
	"html"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Played is a fault as the journal has it.
type Played struct {
	Fault  Fault     `json:"fault"`
	Begin  time.Time `json:"begin"`
	End    time.Time `json:"end"`
	Failed string    `json:"failed,omitempty"`
}

// WriteResult writes result.json, the summary (markdown) and the report
// (HTML with plots) into dir.
func WriteResult(dir string, r Result) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "result.json"), b, 0o600); err != nil {
		return err
	}
	summary := Summary(r)
	if err := os.WriteFile(filepath.Join(dir, SummaryFile), []byte(summary), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, ReportFile), []byte(report(r, summary)), 0o600)
}

var invariantNames = map[int]string{
	InvProtected:   "1 alive nodes protected (no taint > 5 s, eviction or not-ready endpoint)",
	InvDeadEvicted: "2 dead nodes evicted in time",
	InvQuiet:       "3 no atoll-cloud write while nothing happens, nor a Node write without a transition",
	InvViews:       "4 views caught up within a minute; no acked ballot lost; hub consumers caught up",
	InvClients:     "5 clients served in their unit while it is cut off",
	InvFlat:        "6 memory and descriptors flat",
}

// Summary is a run's summary in markdown.
func Summary(r Result) string {
	var b strings.Builder
	s := r.Schedule
	fmt.Fprintf(&b, "# Chaos soak: seed %d, %s, hub %s, %d units\n\n", s.Seed, s.Duration, s.Topology.Shape, len(s.Topology.Units))
	fmt.Fprintf(&b, "Replay: `go tool task soak:chaos -- --seed %d --duration %s --shape %s --units %d --nodes %d`\n\n",
		s.Seed, s.Duration, s.Topology.Shape, len(s.Topology.Units), nodesPerUnit(s.Topology))
	b.WriteString("| fault | planned | played | failed |\n|---|---|---|---|\n")
	planned := s.Counts()
	playedN, failed := map[Kind]int{}, map[Kind]int{}
	for _, p := range r.Played {
		if p.Failed != "" {
			failed[p.Fault.Kind]++
		} else {
			playedN[p.Fault.Kind]++
		}
	}
	for _, k := range slices.Sorted(maps.Keys(planned)) {
		fmt.Fprintf(&b, "| %s | %d | %d | %d |\n", k, planned[k], playedN[k], failed[k])
	}
	if len(r.Stalls) > 0 {
		fmt.Fprintf(&b, "\nkube-apiserver stalls with no fault in force: %d (judged as faults, for %s after too):\n\n", len(r.Stalls), QuietAfter)
		for _, st := range r.Stalls {
			fmt.Fprintf(&b, "- %s\n", st)
		}
	}
	byInv := map[int]int{}
	for _, v := range r.Violations {
		byInv[v.Invariant]++
	}
	b.WriteString("\n| invariant | violations |\n|---|---|\n")
	for _, inv := range slices.Sorted(maps.Keys(invariantNames)) {
		fmt.Fprintf(&b, "| %s | %d |\n", invariantNames[inv], byInv[inv])
	}
	if r.Dropped > 0 {
		fmt.Fprintf(&b, "\n%d more violations of objects already reported are counted, not listed.\n", r.Dropped)
	}
	fmt.Fprintf(&b, "\nWorst bounds seen: protected node tainted %s; dead node tainted %s after its power cut, its last pod deleted %s after the taint.\n",
		r.Bounds.ProtectedTaint.Round(time.Second), r.Bounds.DeadTaint.Round(time.Second), r.Bounds.DeadEvict.Round(time.Second))
	if r.Bounds.ContainersNotReady > 0 {
		fmt.Fprintf(&b, "Endpoints of live nodes the kubelet itself turned not ready (their containers failed readiness; no violation): %d.\n", r.Bounds.ContainersNotReady)
	}
	fmt.Fprintf(&b, "atoll-cloud writes: %d (most to one object: %d, %s), Lease writes %d, TokenReviews %d.\n", r.Writes, r.MaxPerObject, r.MaxObject, r.LeaseWrites, r.Reviews)
	if r.Bounds.HubSamples > 0 {
		fmt.Fprintf(&b, "Hub: read %d times; largest backlog of a durable consumer while nothing happened: %d messages.\n", r.Bounds.HubSamples, r.Bounds.ConsumerBacklog)
	}
	b.WriteString("\n")
	b.WriteString("| unit | client calls | failed | while cut off: ok / failed | answered by another unit | during its other faults: ok / failed |\n|---|---|---|---|---|---|\n")
	for _, u := range slices.Sorted(maps.Keys(r.Calls)) {
		c := r.Calls[u]
		fmt.Fprintf(&b, "| %s | %d | %d | %d / %d | %d | %d / %d |\n", u, c.OK+c.Failed, c.Failed, c.CutOK, c.CutFailed, c.Foreign, c.OtherFaultOK, c.OtherBad)
	}
	fmt.Fprintf(&b, "\n| component | processes judged (ran %s past their first 10 min) | RSS slope beside connections (MiB/h, median) | descriptors slope, connections apart (/h, median) | last RSS, all processes (MiB) |\n|---|---|---|---|---|\n", JudgeAfter)
	for _, comp := range components {
		sl, ok := r.Slopes[comp]
		var last float64
		if n := len(r.Samples); n > 0 {
			last = r.Samples[n-1].Usage[comp].RSSMiB
		}
		switch {
		case !ok || last == 0:
		case sl.Judged == 0:
			fmt.Fprintf(&b, "| %s | 0 | – | – | %.0f |\n", comp, last)
		default:
			fmt.Fprintf(&b, "| %s | %d | %+.1f | %+.1f | %.0f |\n", comp, sl.Judged, sl.RSS, sl.FDs, last)
		}
	}
	if len(r.Violations) > 0 {
		b.WriteString("\n## Violations\n\n")
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "- %s inv %d %s: %s", v.T.Format("15:04:05"), v.Invariant, v.Object, v.Detail)
			if len(v.Faults) > 0 {
				fmt.Fprintf(&b, " (in force: %s)", strings.Join(v.Faults, "; "))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

func nodesPerUnit(t Topology) int {
	n := 0
	for _, nodes := range t.Units {
		n = max(n, len(nodes))
	}
	return n
}

// point is one value of a plotted series.
type point struct{ x, y float64 }

// chart draws series as lines over [0, xmax] minutes, up to ymax (0:
// the largest value and a tenth), with a dashed line at the schedule's
// start.
func chart(title, unit string, xmax, ymax, start float64, series map[string][]point) string {
	const w, h, left, bottom = 900.0, 220.0, 60.0, 30.0
	if ymax == 0 {
		for _, pts := range series {
			for _, p := range pts {
				ymax = max(ymax, p.y)
			}
		}
		ymax = max(ymax, 1) * 1.1
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<h3>%s</h3><svg width="%.0f" height="%.0f" font-size="11">`, html.EscapeString(title), w+160, h+bottom)
	fmt.Fprintf(&b, `<line x1="%.0f" y1="0" x2="%.0f" y2="%.0f" stroke="#999"/><line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#999"/>`,
		left, left, h, left, h, w, h)
	fmt.Fprintf(&b, `<text x="2" y="12">%.4g %s</text><text x="2" y="%.0f">0</text><text x="%.0f" y="%.0f">%.0f min</text>`,
		ymax, html.EscapeString(unit), h, w-40, h+20, xmax)
	fmt.Fprintf(&b, `<line x1="%[1]v" y1="0" x2="%[1]v" y2="%[2]v" stroke="#999" stroke-dasharray="4"/>`, left+start/xmax*(w-left), h)
	palette := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"}
	for i, name := range slices.Sorted(maps.Keys(series)) {
		color := palette[i%len(palette)]
		var pts []string
		for _, p := range series[name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", left+p.x/xmax*(w-left), h-p.y/ymax*h))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, color, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%.0f" y="%d" fill="%s">%s</text>`, w+10, 14+14*i, color, html.EscapeString(name))
	}
	b.WriteString("</svg>")
	return b.String()
}

// timeline draws each fault as a bar in its unit's row (the cloud's
// first), and each violation as a red mark, over [origin, origin+xmax
// minutes].
func timeline(played []Played, violations []Violation, units []string, origin time.Time, xmax float64) string {
	const w, left, row = 900.0, 60.0, 18.0
	rows := append([]string{"cloud"}, units...)
	h := row * float64(len(rows))
	x := func(t time.Time) float64 { return left + t.Sub(origin).Minutes()/xmax*(w-left) }
	var b strings.Builder
	fmt.Fprintf(&b, `<h3>Faults and violations</h3><svg width="%.0f" height="%.0f" font-size="11">`, w+160, h+40)
	colors := map[Kind]string{}
	palette := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a"}
	for i, w := range weights {
		colors[w.kind] = palette[i%len(palette)]
	}
	for i, r := range rows {
		fmt.Fprintf(&b, `<text x="2" y="%.0f">%s</text>`, row*float64(i)+13, html.EscapeString(r))
	}
	for _, p := range played {
		i := max(slices.Index(rows, cmp.Or(p.Fault.Unit, "cloud")), 0)
		end := p.End
		if end.IsZero() || end.Sub(p.Begin) < 5*time.Second {
			end = p.Begin.Add(5 * time.Second)
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.0f" width="%.1f" height="%.0f" fill="%s"><title>%s</title></rect>`,
			x(p.Begin), row*float64(i)+3, x(end)-x(p.Begin), row-6, colors[p.Fault.Kind], html.EscapeString(p.Fault.String()))
	}
	for _, v := range violations {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="0" x2="%.1f" y2="%.0f" stroke="red"><title>%s</title></line>`,
			x(v.T), x(v.T), h, html.EscapeString(fmt.Sprintf("inv %d %s: %s", v.Invariant, v.Object, v.Detail)))
	}
	for i, wk := range weights {
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" fill="%s">%s</text>`, left+float64(i%6)*140, h+14+14*float64(i/6), colors[wk.kind], wk.kind)
	}
	b.WriteString("</svg>")
	return b.String()
}

func report(r Result, summary string) string {
	// The plots start with the first sample (the warm-up's), the dashed
	// line is the schedule's start.
	origin, end := r.Start, r.Start.Add(r.Schedule.Duration)
	if n := len(r.Samples); n > 0 {
		origin, end = r.Samples[0].T.Add(-SampleEvery), r.Samples[n-1].T
	}
	start := origin
	units := slices.Sorted(maps.Keys(r.Schedule.Topology.Units))
	xmax := max(end.Sub(origin).Minutes(), 1)
	at := r.Start.Sub(origin).Minutes()
	success, rss, fds, writes := map[string][]point{}, map[string][]point{}, map[string][]point{}, map[string][]point{}
	goroutines, lag, cpu := map[string][]point{}, map[string][]point{}, map[string][]point{}
	for _, s := range r.Samples {
		x := s.T.Sub(start).Minutes()
		for u, c := range s.Calls {
			if c[0]+c[1] > 0 {
				success["unit "+u] = append(success["unit "+u], point{x, 100 * float64(c[0]) / float64(c[0]+c[1])})
			}
		}
		for comp, cores := range s.CPU {
			cpu[comp] = append(cpu[comp], point{x, cores})
		}
		if s.Machine > 0 {
			cpu["the whole machine"] = append(cpu["the whole machine"], point{x, s.Machine})
		}
		for comp, u := range s.Usage {
			rss[comp] = append(rss[comp], point{x, u.RSSMiB})
			fds[comp] = append(fds[comp], point{x, float64(u.FDs)})
		}
		if len(s.Agents) > 0 {
			var g, behind float64
			for _, m := range s.Agents {
				g += m.Goroutines
				behind = max(behind, m.Behind)
			}
			goroutines["atoll-edge (sum over the agents that answered)"] = append(goroutines["atoll-edge (sum over the agents that answered)"], point{x, g})
			lag["longest view feed catch-up due"] = append(lag["longest view feed catch-up due"], point{x, behind})
		}
		per := SampleEvery.Minutes()
		writes["atoll-cloud (Leases apart)"] = append(writes["atoll-cloud (Leases apart)"], point{x, float64(s.Writes) / per})
		writes["atoll-cloud Lease"] = append(writes["atoll-cloud Lease"], point{x, float64(s.LeaseWrites) / per})
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<!doctype html><html><head><meta charset=\"utf-8\"><title>Chaos soak, seed %d</title></head><body style=\"font-family:sans-serif\">", r.Schedule.Seed)
	b.WriteString(timeline(r.Played, r.Violations, units, origin, xmax))
	b.WriteString(chart("Client calls answered, per unit (from the schedule's start)", "%", xmax, 100, at, success))
	b.WriteString(chart("CPU by component (sum of processes) and of the whole machine", "cores", xmax, 0, at, cpu))
	b.WriteString(chart("RSS by component (sum of processes)", "MiB", xmax, 0, at, rss))
	b.WriteString(chart("Open descriptors by component (sum of processes)", "fds", xmax, 0, at, fds))
	b.WriteString(chart("Goroutines", "", xmax, 0, at, goroutines))
	b.WriteString(chart("Agents' view feeds", "s", xmax, 0, at, lag))
	b.WriteString(chart("atoll-cloud writes", "/min", xmax, 0, at, writes))
	fmt.Fprintf(&b, "<pre>%s</pre><h3>Schedule</h3><pre>%s</pre></body></html>", html.EscapeString(summary), html.EscapeString(r.Schedule.String()))
	return b.String()
}
