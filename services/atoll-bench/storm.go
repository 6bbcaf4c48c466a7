package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// stormRow is the reconnect storm at one size (--scale-storm): the hub's
// process (atoll-cloud with the embedded hub, or the external server)
// killed with every leaf linked, and started again.
type stormRow struct {
	nodes int
	// From the kill: atoll-cloud ready again, every agent's link linked
	// again, every agent's feeds caught up after their link came back.
	ready, linked, current time.Duration
	unlinked, behind       int     // agents not linked, feeds not caught up, at the timeout
	recut                  int     // agents whose new link was cut again
	slowConsumers          int     // the hub's "Slow Consumer" log lines after the restart
	died                   string  // how the restarted process ended during the storm, if it did
	peakMiB                float64 // the hub's process's resident memory, most, from the restart until the storm ended
	writes                 map[string]int
	paths                  map[string]int
	unhealthy, tainted     int // Nodes with an unhealthy verdict, with a NoExecute taint, after the storm
	// The feeds' catch-ups from the kill until the storm ended, by
	// reason, those that created a consumer, by reason, and those that
	// failed.
	catchUps, consumers map[string]int
	failed              int
}

// stormEnv is what the storm acts on and reads.
type stormEnv struct {
	agents   []*leafAgent
	feeds    int // view feeds per agent
	kill     func() error
	restart  func() (pid int, err error)
	died     func() error        // non-nil once the restarted process has ended (an OOM kill at its limit)
	metrics  prometheus.Gatherer // the agents' feeds' metrics
	auditDir string
	hubLog   string // the hub's server's log (atoll-cloud's with the embedded hub)
	kube     kubernetes.Interface
	timeout  time.Duration // for every agent to link and catch up
	after    time.Duration // watched after that, for links cut again
	progress *progress
	// profile, when set, saves a CPU profile of the restarted hub over
	// the storm's first stormProfile.
	profile func(context.Context) error
}

// stormProfile is how long a storm's hub profile runs from the restart.
const stormProfile = 2 * time.Minute

// runStorm kills the hub's process with every agent linked, starts it
// again on the same store, and measures how the fleet comes back.
func runStorm(ctx context.Context, n int, e stormEnv) (stormRow, error) {
	row := stormRow{nodes: n}
	gen0 := make([]uint64, len(e.agents))
	re0 := make([]int64, len(e.agents))
	for i, a := range e.agents {
		gen0[i], re0[i] = a.link.Gen(), a.link.Reconnects.Load()
	}
	caught0 := reconnectCatchUps(e.metrics)
	reasons0, consumers0, failed0 := catchUps(e.metrics)
	writes0, err := atollWrites(e.auditDir)
	if err != nil {
		return row, err
	}
	logAt := fileSize(e.hubLog)

	e.progress.begin(fmt.Sprintf("storm %d: the hub's process killed, starting again", n))
	killed := time.Now()
	if err := e.kill(); err != nil {
		return row, err
	}
	pid, err := e.restart()
	if err != nil {
		return row, err
	}
	row.ready = time.Since(killed)
	stop := make(chan struct{})
	peak, _ := sampleRSS(pid, stop)
	e.progress.end()
	profiled := make(chan error, 1)
	if e.profile != nil {
		go func() { profiled <- e.profile(ctx) }()
	} else {
		profiled <- nil
	}

	e.progress.begin(fmt.Sprintf("storm %d: agents linking again and catching up", n))
	deadline := time.Now().Add(e.timeout)
	for time.Now().Before(deadline) {
		if err := e.died(); err != nil {
			row.died = fmt.Sprintf("%v after %v", err, time.Since(killed).Round(time.Second))
			break
		}
		row.unlinked = 0
		for i, a := range e.agents {
			if g := a.link.Gen(); g == 0 || g == gen0[i] {
				row.unlinked++
			}
		}
		if row.unlinked == 0 && row.linked == 0 {
			row.linked = time.Since(killed)
		}
		row.behind = max(0, e.feeds*len(e.agents)-int(reconnectCatchUps(e.metrics)-caught0))
		if row.linked > 0 && row.behind == 0 {
			row.current = time.Since(killed)
			break
		}
		e.progress.count(len(e.agents)-row.unlinked, len(e.agents), "linked again")
		select {
		case <-ctx.Done():
			close(stop)
			return row, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	e.progress.end()
	if row.died == "" {
		if err := e.progress.wait(ctx, fmt.Sprintf("storm %d: watching for links cut again", n), e.after); err != nil {
			close(stop)
			return row, err
		}
		if err := e.died(); err != nil {
			row.died = err.Error()
		}
	}
	close(stop)
	if err := <-profiled; err != nil {
		return row, fmt.Errorf("the hub's profile: %w", err)
	}
	row.peakMiB = peak()
	for i, a := range e.agents {
		if a.link.Reconnects.Load()-re0[i] > 1 {
			row.recut++
		}
	}
	row.slowConsumers = countLines(e.hubLog, logAt, "Slow Consumer")
	reasons1, consumers1, failed1 := catchUps(e.metrics)
	row.catchUps, row.consumers, row.failed = since0(reasons0, reasons1), since0(consumers0, consumers1), int(failed1-failed0)
	writes1, err := atollWrites(e.auditDir)
	if err != nil {
		return row, err
	}
	row.writes = map[string]int{}
	for k, v := range writes1 {
		if d := v - writes0[k]; d > 0 {
			row.writes[k] = d
		}
	}
	if row.paths, err = writePaths(e.auditDir, sum(writes0)); err != nil {
		return row, err
	}
	nodes, err := e.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		return row, err
	}
	for _, nd := range nodes.Items {
		if nd.Annotations[wellknown.AnnotationVerdict] == wellknown.VerdictUnhealthy {
			row.unhealthy++
		}
		for _, t := range nd.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoExecute {
				row.tainted++
				break
			}
		}
	}
	return row, nil
}

// printStorm prints the storm's rows.
func printStorm(out io.Writer, rows []stormRow) error {
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nnodes\tkill → ready\t→ all linked\t→ all caught up\tnot linked / feeds behind at the timeout\tlinks cut again\tslow-consumer lines\tpeak RSS MiB\tatoll writes\tunhealthy verdicts\tNoExecute taints")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d / %d\t%d\t%d\t%.0f\t%d\t%d\t%d\n", r.nodes, since(r.ready),
			since(r.linked), since(r.current), r.unlinked, r.behind, r.recut,
			r.slowConsumers, r.peakMiB, sum(r.writes), r.unhealthy, r.tainted)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.died != "" {
			fmt.Fprintf(out, "the hub's process ended during the storm at %d nodes: %s\n", r.nodes, r.died)
		}
		if len(r.writes) > 0 {
			fmt.Fprintf(out, "atoll-cloud writes in the storm at %d nodes: %v; what they changed: %v\n", r.nodes, r.writes, r.paths)
		}
		fmt.Fprintf(out, "the feeds' catch-ups in the storm at %d nodes, by reason: %v; of which with a consumer: %v; failed: %d\n", r.nodes, r.catchUps, r.consumers, r.failed)
	}
	return nil
}

// since formats a time from the kill; "never" for one not reached.
func since(d time.Duration) string {
	if d == 0 {
		return "never"
	}
	return d.Round(100 * time.Millisecond).String()
}

// reconnectCatchUps is how many catch-ups the agents' feeds made after
// their link came back.
func reconnectCatchUps(g prometheus.Gatherer) float64 {
	made, _, _ := catchUps(g)
	return made["reconnect"]
}

// catchUps is how many catch-ups the agents' feeds made and how many
// consumers they created, by reason, and how many catch-ups failed.
func catchUps(g prometheus.Gatherer) (made, consumers map[string]float64, failed float64) {
	made, consumers = map[string]float64{}, map[string]float64{}
	mfs, err := g.Gather()
	if err != nil {
		return made, consumers, 0
	}
	byReason := func(mf *dto.MetricFamily, into map[string]float64) {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					into[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, mf := range mfs {
		switch mf.GetName() {
		case "atoll_viewfeed_catchups_total":
			byReason(mf, made)
		case "atoll_viewfeed_consumers_total":
			byReason(mf, consumers)
		case "atoll_viewfeed_catchup_errors_total":
			for _, m := range mf.GetMetric() {
				failed += m.GetCounter().GetValue()
			}
		}
	}
	return made, consumers, failed
}

// since0 is what grew from before to after, by key.
func since0(before, after map[string]float64) map[string]int {
	out := map[string]int{}
	for k, n := range after {
		if d := int(n - before[k]); d > 0 {
			out[k] = d
		}
	}
	return out
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// countLines counts the lines of path after offset that contain s.
func countLines(path string, offset int64, s string) (n int) {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return 0
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}
