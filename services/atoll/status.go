package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/cliflags"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func statusCmd(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll status", flag.ContinueOnError)
	var hf hubFlags
	hf.register(fs)
	unit := fs.String("unit", "", "only this unit")
	out := &outputFlag{accepted: []string{"wide", "json", "yaml"}}
	fs.Var(out, "o", "output `format`: wide (the per-node table), json or yaml (the ClusterStatus); default: the verdict and the per-unit table")
	fs.Var(out, "output", "same as -o `format`")
	asJSON := fs.Bool("json", false, "deprecated: same as -o json")
	col := colorFlag("auto")
	fs.Var(&col, "color", "`when` to colour: auto (only on a terminal, and $NO_COLOR unset), always or never")
	exitCode := fs.Bool("exit-code", false, "exit 3 when the verdict is DEGRADED, 4 when AT RISK (0 when SAFE)")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for atoll-cloud to answer")
	if err := parseFlags(fs, args, stdout, "atoll status [--unit U] [-o wide|json|yaml] [--color auto|always|never] [--exit-code] [hub flags]"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("status: unexpected argument %q (use --unit)", fs.Arg(0))
	}
	if *timeout <= 0 {
		return cliflags.Usagef("status: --timeout %v must be positive", *timeout)
	}
	if *asJSON {
		if out.value != "" && out.value != "json" {
			return cliflags.Usagef("status: --json and -o %s: give one (--json is -o json)", out.value)
		}
		out.value = "json"
	}
	nc, err := hf.connect("atoll status")
	if err != nil {
		return err
	}
	defer nc.Close()
	cs, err := requestStatus(ctx, nc, *unit, *timeout)
	if err != nil {
		return err
	}
	if *unit != "" && len(cs.GetUnits()) == 0 {
		return fmt.Errorf("status: atoll-cloud (replica %s) knows no unit %q: no node carries it as its unit label", cs.GetReplica(), *unit)
	}
	if err := printStatus(stdout, cs, *unit, out.value, col.painter(stdout)); err != nil {
		return err
	}
	if s := assess(cs).safety; *exitCode && s != Safe {
		return cliflags.ExitCode{Code: s.exitCode()}
	}
	return nil
}

// printStatus writes cs in the output format: "" the verdict and the
// per-unit table, "wide" the verdict and the per-node tables, "json" or
// "yaml" the ClusterStatus. unit is the --unit asked for.
func printStatus(w io.Writer, cs *atollv1.ClusterStatus, unit, output string, p painter) error {
	switch output {
	case "json", "yaml":
		encode := func() ([]byte, error) { return toJSON(cs, true) }
		if output == "yaml" {
			encode = func() ([]byte, error) { return toYAML(cs) }
		}
		b, err := encode()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", bytes.TrimSuffix(b, []byte("\n")))
		return err
	}
	if len(cs.GetUnits()) == 0 {
		_, err := fmt.Fprintln(w, "no edge units: no node carries a unit label")
		return err
	}
	if _, err := fmt.Fprintf(w, "%s\n\n", assess(cs).verdict(unit, p)); err != nil {
		return err
	}
	if output == "wide" {
		return renderStatus(w, cs, p)
	}
	return renderUnits(w, cs, p)
}

// renderUnits prints one line per unit: its safety, disruption state, node
// counts and what the verdict found in it.
func renderUnits(w io.Writer, cs *atollv1.ClusterStatus, p painter) error {
	at := cs.GetTime().AsTime()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "UNIT\t%s\tSTATE\tNODES\tREADY\tPEERS-HEALTHY\tPROTECTED\tHOLD-UNTIL\tNOTES\n", p.paint(plain, "SAFETY"))
	for _, u := range cs.GetUnits() {
		a := assessUnit(u, at)
		ready, healthy, protected := 0, 0, 0
		for _, n := range u.GetNodes() {
			if n.GetReady() == "True" {
				ready++
			}
			if n.GetVerdict() == atollv1.Verdict_VERDICT_HEALTHY {
				healthy++
			}
			if n.GetProtected() {
				protected++
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", u.GetUnit(), p.paint(safetyColor(a.safety), a.safety.String()),
			u.GetState(), a.nodes, ready, healthy, protected, holdUntil(u, at), a.notes())
	}
	return tw.Flush()
}

// requestStatus asks one atoll-cloud replica (the status endpoint of the
// micro service events.CloudService) for the status of unit (empty: every
// unit).
func requestStatus(ctx context.Context, nc *nats.Conn, unit string, timeout time.Duration) (*atollv1.ClusterStatus, error) {
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var cs atollv1.ClusterStatus
	err := events.Request(rctx, nc, events.StatusSubject, &atollv1.StatusRequest{Unit: unit}, &cs)
	var se *events.ServiceError
	switch {
	case err == nil:
		return &cs, nil
	case errors.As(err, &se):
		return nil, fmt.Errorf("atoll-cloud refused the status request (code %d): %s", se.Code, se.Description)
	case errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("no atoll-cloud answered on %s within %v: no responders (atoll-cloud answers with --membership-source=kubernetes only; `nats micro ls` lists the running %s services)",
			events.StatusSubject, timeout, events.CloudService)
	case ctx.Err() != nil:
		return nil, ctx.Err() // interrupted
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return nil, fmt.Errorf("no atoll-cloud answered on %s within %v", events.StatusSubject, timeout)
	default:
		return nil, fmt.Errorf("status: %w", err)
	}
}

// renderStatus prints one table per unit: the unit's state, then its
// nodes. Ages and the time left of a hold are measured against the
// status's own time (the cloud's clock), not the local one.
func renderStatus(w io.Writer, cs *atollv1.ClusterStatus, p painter) error {
	at := cs.GetTime().AsTime()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, u := range cs.GetUnits() {
		if i > 0 {
			fmt.Fprintln(tw)
		}
		fmt.Fprintln(tw, "UNIT\tSTATE\tHOLD-UNTIL")
		fmt.Fprintf(tw, "%s\t%s\t%s\n", u.GetUnit(), u.GetState(), holdUntil(u, at))
		if err := tw.Flush(); err != nil { // the node table aligns on its own
			return err
		}
		fmt.Fprintf(tw, "  NODE\t%s\t%s\tVOTES(h/u/n)\tCHECKERS(normal/abnormal/total)\tAGE\tPROTECTED\tVIEWS\tTUNNELS\tPROBE-CREDENTIALS\n", p.paint(plain, "CLOUD"), p.paint(plain, "VERDICT"))
		for _, n := range u.GetNodes() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d/%d\t%d/%d/%d\t%s\t%s\t%s\t%s\t%s\n",
				n.GetName(), p.paint(readyColor(n.GetReady()), n.GetReady()), p.paint(verdictColor(n.GetVerdict()), verdictName(n.GetVerdict())),
				n.GetHealthyVotes(), n.GetUnhealthyVotes(), n.GetUndecidedVotes(),
				n.GetNormal(), n.GetAbnormal(), n.GetCheckers(),
				age(n, at), yesNo(n.GetProtected()), viewsColumn(n), tunnelsColumn(cs, n), refusalsColumn(n))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// viewsColumn says whether the node's agent holds the views the cloud
// published: "current", "behind: <views>", or "unknown" (no report with
// fingerprints, or a cloud that does not tell).
func viewsColumn(n *atollv1.NodeStatus) string {
	switch b := n.GetViewsBehind(); b {
	case "":
		return "current"
	case "unknown":
		return b
	default:
		return "behind: " + b
	}
}

// refusalsColumn names the peers that refuse the node's probe
// credentials, with the status they answered and, when several of its
// check plugins are refused, the plugin; "-" when none is.
func refusalsColumn(n *atollv1.NodeStatus) string {
	rs := n.GetProbeRefusals()
	if len(rs) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(rs))
	for _, r := range rs {
		part := "refused by " + r.GetPeer() + " (" + r.GetStatus() + ")"
		if len(rs) > 1 {
			part = r.GetPlugin() + " " + part
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// tunnelsColumn is the node's live tunnel sessions summed over the cloud
// replicas, "-" when no replica told its sessions.
func tunnelsColumn(cs *atollv1.ClusterStatus, n *atollv1.NodeStatus) string {
	if cs.GetTunnelReplicas() == 0 {
		return "-"
	}
	return strconv.FormatUint(uint64(n.GetTunnelSessions()), 10)
}

func holdUntil(u *atollv1.UnitStatus, at time.Time) string {
	if u.GetHoldUntil() == nil {
		return "-"
	}
	end := u.GetHoldUntil().AsTime()
	if left := end.Sub(at); left > 0 {
		return fmt.Sprintf("%s (in %v)", end.UTC().Format(time.RFC3339), left.Round(time.Second))
	}
	return fmt.Sprintf("%s (ended %v ago)", end.UTC().Format(time.RFC3339), at.Sub(end).Round(time.Second))
}

// age is how long before the status the freshest vote reached the hub.
func age(n *atollv1.NodeStatus, at time.Time) string {
	if n.GetLastVote() == nil {
		return "-"
	}
	return max(at.Sub(n.GetLastVote().AsTime()), 0).Round(time.Second).String()
}

func readyColor(r string) color {
	switch r {
	case "True":
		return green
	case "False":
		return red
	}
	return yellow
}

func verdictColor(v atollv1.Verdict) color {
	switch v {
	case atollv1.Verdict_VERDICT_HEALTHY:
		return green
	case atollv1.Verdict_VERDICT_UNHEALTHY:
		return red
	}
	return plain
}

func verdictName(v atollv1.Verdict) string {
	switch v {
	case atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY:
		return strings.ToLower(strings.TrimPrefix(v.String(), "VERDICT_"))
	default:
		return "none"
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
