package main

import (
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
	asJSON := fs.Bool("json", false, "print the ClusterStatus as JSON")
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for atoll-cloud to answer")
	if err := parseFlags(fs, args, stdout, "atoll status [--unit U] [--json] [hub flags]"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.Usagef("status: unexpected argument %q (use --unit)", fs.Arg(0))
	}
	if *timeout <= 0 {
		return cliflags.Usagef("status: --timeout %v must be positive", *timeout)
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
	if *asJSON {
		out, err := toJSON(cs, true)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, string(out))
		return err
	}
	return renderStatus(stdout, cs)
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
func renderStatus(w io.Writer, cs *atollv1.ClusterStatus) error {
	if len(cs.GetUnits()) == 0 {
		_, err := fmt.Fprintln(w, "no edge units: no node carries a unit label")
		return err
	}
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
		fmt.Fprintln(tw, "  NODE\tCLOUD\tVERDICT\tVOTES(h/u/n)\tCHECKERS(normal/abnormal/total)\tAGE\tPROTECTED\tVIEWS\tTUNNELS")
		for _, n := range u.GetNodes() {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d/%d\t%d/%d/%d\t%s\t%s\t%s\t%s\n",
				n.GetName(), n.GetReady(), verdictName(n.GetVerdict()),
				n.GetHealthyVotes(), n.GetUnhealthyVotes(), n.GetUndecidedVotes(),
				n.GetNormal(), n.GetAbnormal(), n.GetCheckers(),
				age(n, at), yesNo(n.GetProtected()), viewsColumn(n), tunnelsColumn(cs, n))
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
