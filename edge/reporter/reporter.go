// Package reporter publishes the edge node's TopologyUpdate: its name,
// unit, addresses and route URL, what its prober measured and which of
// its checks' credentials peers refuse, and the views it holds; at start,
// soon after the refusals or the views change, and then periodically, so
// the cloud's topology service always has a fresh picture even after it
// missed messages while the node's link was down.
package reporter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"go.uber.org/fx"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes the reporter.
type Config struct {
	// Period between reports.
	Period time.Duration
	// Unit is the unit the node declares itself in (empty: none).
	Unit string
	// InternalIP is the node's InternalIP address.
	InternalIP string
	// Labels are reported as the node's labels.
	Labels map[string]string
	// Version is the agent's build version.
	Version string
}

// DefaultConfig reports every 30 s.
func DefaultConfig() Config { return Config{Period: 30 * time.Second, Version: "dev"} }

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.Period <= 0 {
		return errors.New("reporter: period must be positive")
	}
	if c.Unit != "" {
		if err := events.ValidName(c.Unit); err != nil {
			return fmt.Errorf("reporter: unit: %w", err)
		}
	}
	if c.InternalIP != "" && net.ParseIP(c.InternalIP) == nil {
		return fmt.Errorf("reporter: internal IP %q is not an IP address", c.InternalIP)
	}
	return nil
}

// ProbeSource is what the prober tells the cloud: the latest round-trip
// times to unit peers, and the refusals of its checks' credentials (a
// configuration error the cloud shows); the reporter reports again soon
// after the refusals change.
type ProbeSource interface {
	RTTs() []*atollv1.PeerRTT
	Refusals() []*atollv1.ProbeRefusal
	RefusalChanges() <-chan struct{}
}

// ViewSource gives the fingerprints of the assignment and unit view the
// agent holds (the membership), so the cloud can show agents that are
// behind; the reporter reports again soon after every change.
type ViewSource interface {
	Fingerprints() (assignment, unitView string)
	Changes() <-chan struct{}
}

// minInterval bounds how often changes of the views held or of the probe
// refusals trigger reports.
const minInterval = time.Second

// Reporter publishes TopologyUpdates.
type Reporter struct {
	cfg   Config
	node  *natsnode.Node
	link  *hublink.Link
	probe ProbeSource
	views ViewSource
	log   *slog.Logger
}

// SetViewSource has every report carry the fingerprints views holds. Call
// it before Run.
func (r *Reporter) SetViewSource(views ViewSource) { r.views = views }

// New returns a reporter for node, publishing over link; probe may be
// nil.
func New(cfg Config, node *natsnode.Node, link *hublink.Link, probe ProbeSource, log *slog.Logger) (*Reporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Reporter{cfg: cfg, node: node, link: link, probe: probe, log: log.With("component", "reporter")}, nil
}

// Update builds the node's current TopologyUpdate.
func (r *Reporter) Update() *atollv1.TopologyUpdate {
	u := &atollv1.TopologyUpdate{
		Node:     r.node.Name(),
		Unit:     r.cfg.Unit,
		Labels:   r.cfg.Labels,
		RouteUrl: r.node.RouteURL(),
		Version:  r.cfg.Version,
		Time:     timestamppb.Now(),
	}
	if r.cfg.InternalIP != "" {
		u.Addresses = append(u.Addresses, &atollv1.NodeAddress{Type: "InternalIP", Address: r.cfg.InternalIP})
	}
	if r.probe != nil {
		u.Peers = r.probe.RTTs()
		u.ProbeRefusals = r.probe.Refusals()
	}
	if r.views != nil {
		u.AssignmentFingerprint, u.UnitViewFingerprint = r.views.Fingerprints()
	}
	return u
}

// Run reports at once and then every period until ctx is done.
func (r *Reporter) Run(ctx context.Context) error {
	subj, err := events.TopologySubject(r.node.Name())
	if err != nil {
		return err
	}
	t := time.NewTicker(r.cfg.Period)
	defer t.Stop()
	var viewChanges, refusalChanges <-chan struct{} // nil: never
	if r.views != nil {
		viewChanges = r.views.Changes()
	}
	if r.probe != nil {
		refusalChanges = r.probe.RefusalChanges()
	}
	for {
		u := r.Update()
		id := r.node.Name() + "@" + strconv.FormatInt(u.GetTime().AsTime().UnixNano(), 10)
		if err := events.Publish(r.link.Conn(), subj, u, id); err != nil {
			r.log.Warn("topology report not sent", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			continue
		case <-viewChanges:
		case <-refusalChanges:
		}
		// The views held or the probe refusals changed: tell the cloud
		// soon, at most once a second.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(minInterval):
		}
	}
}

type params struct {
	fx.In
	Config Config
	Node   *natsnode.Node
	Link   *hublink.Link
	Probe  ProbeSource `optional:"true"`
	Views  ViewSource  `optional:"true"`
	Log    *slog.Logger
}

// Module runs the reporter with the app. It reports RTTs and probe
// refusals when the app provides a ProbeSource, and the fingerprints of
// the views held when it provides a ViewSource.
var Module = fx.Module("reporter",
	fx.Provide(func(p params) (*Reporter, error) {
		r, err := New(p.Config, p.Node, p.Link, p.Probe, p.Log)
		if err == nil && p.Views != nil {
			r.SetViewSource(p.Views)
		}
		return r, err
	}),
	fx.Invoke(func(lc fx.Lifecycle, r *Reporter, log *slog.Logger) { fxrun.Background(lc, log, "reporter", r.Run) }),
)
