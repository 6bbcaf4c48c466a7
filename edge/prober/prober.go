// Package prober checks the node's unit peers every period with weighted
// check plugins and publishes one ProbeReport per round on
// atoll.health.probe.<unit>.<self>. A peer is normal when its score, the
// sum of 100*weight over the plugins that passed, reaches the scoreline.
//
// The node checks itself too: a unit of four split two against two then
// gives every node two normal and two abnormal reports, and no verdict,
// rather than a verdict of whichever half the node sits in.
//
// Every report is signed with the node's identity key (events.SignMsg):
// peers drop a report that is not signed by the key the cloud publishes
// for its checker.
package prober

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes the prober.
type Config struct {
	// Period between rounds.
	Period time.Duration
	// RoundBudget is the time a round may take, checks and report. Keep
	// it at most half the voters' freshness window (their timeout, 6 s by
	// default), so that a report is never stale before the next one is
	// out, whatever the unit's size.
	RoundBudget time.Duration
	// Scoreline is the score a peer needs to be normal.
	Scoreline float64
	// Parallelism bounds the members checked at once. Each round uses the
	// fewest workers that fit the round in RoundBudget even if every
	// check times out (see workers), up to this bound.
	Parallelism int
	// Plugins run against every peer each round.
	Plugins []PluginConfig
}

// DefaultConfig checks the kubelet's port and its /healthz every 2 s,
// within a round budget of 3 s (half the voter's 6 s freshness window).
// A member takes at most 2 s to check (two plugins, two attempts of
// 500 ms each), so with up to 128 workers a unit of 128 members fits the
// budget even when every member hangs.
func DefaultConfig() Config {
	return Config{
		Period:      2 * time.Second,
		RoundBudget: 3 * time.Second,
		Scoreline:   100,
		Parallelism: 128,
		Plugins: []PluginConfig{
			{Kind: "tcp", Name: "kubelet-port", Weight: 0.5, Timeout: 500 * time.Millisecond, Retries: 1, Port: 10250},
			{Kind: "http", Name: "kubelet-healthz", Weight: 0.5, Timeout: 500 * time.Millisecond, Retries: 1, Port: 10250,
				Scheme: "https", Path: "/healthz", InsecureSkipVerify: true},
		},
	}
}

// maxParallelism bounds Parallelism: more concurrent checks than this from
// one node is a flood, not a probe.
const maxParallelism = 1024

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.Period <= 0 {
		return errors.New("prober: period must be positive")
	}
	if c.Parallelism < 1 || c.Parallelism > maxParallelism {
		return fmt.Errorf("prober: parallelism %d must be between 1 and %d", c.Parallelism, maxParallelism)
	}
	if len(c.Plugins) == 0 {
		return errors.New("prober: no check plugins")
	}
	total := 0.0
	names := map[string]bool{}
	for i, p := range c.Plugins {
		name := p.name()
		if name == "" {
			return fmt.Errorf("prober: plugin %d has no kind", i)
		}
		if names[name] {
			return fmt.Errorf("prober: plugin name %q used twice", name)
		}
		names[name] = true
		if p.Weight <= 0 {
			return fmt.Errorf("prober: plugin %s: weight must be positive", name)
		}
		if p.Timeout <= 0 || p.Timeout > c.Period {
			return fmt.Errorf("prober: plugin %s: timeout %v must be positive and at most the period %v", name, p.Timeout, c.Period)
		}
		if p.Retries < 0 {
			return fmt.Errorf("prober: plugin %s: retries must not be negative", name)
		}
		total += 100 * p.Weight
	}
	if c.Scoreline <= 0 || c.Scoreline > total+1e-9 {
		return fmt.Errorf("prober: scoreline %v must be positive and at most %v (100 × the sum of weights)", c.Scoreline, total)
	}
	if c.RoundBudget < 100*time.Millisecond {
		return fmt.Errorf("prober: round budget %v must be at least 100ms", c.RoundBudget)
	}
	return nil
}

// memberWorstCase is the longest one member's check can take: plugins run
// one after the other, each with its attempts.
func (c Config) memberWorstCase() time.Duration {
	var d time.Duration
	for _, p := range c.Plugins {
		d += time.Duration(p.Retries+1) * p.Timeout
	}
	return d
}

// reportReserve is the part of the budget kept for building and sending
// the report after the checks' deadline.
func reportReserve(budget time.Duration) time.Duration {
	return min(budget/10, 200*time.Millisecond)
}

// workers is the number of members checked at once in a unit of n: the
// fewest that fit every check in the budget in the worst case (each member
// taking memberWorstCase), capped by Parallelism. fits is false when even
// Parallelism workers cannot, or when one member's worst case alone
// exceeds the budget: members whose check the deadline cuts are then left
// out of the report. (Validate does not refuse such a config: a member
// that fails a plugin usually becomes conclusive early, see checkTarget,
// so the round still ends in time in all but the worst case, which the
// prober then reports.)
func (c Config) workers(n int) (w int, fits bool) {
	if n == 0 {
		return 0, true
	}
	checks := c.RoundBudget - reportReserve(c.RoundBudget)
	worst := max(c.memberWorstCase(), 1)
	perWorker := max(int(checks/worst), 1)
	need := (n + perWorker - 1) / perWorker
	if need > c.Parallelism {
		return c.Parallelism, false
	}
	return need, worst <= checks
}

func (p PluginConfig) name() string {
	if p.Name != "" {
		return p.Name
	}
	return p.Kind
}

type plugin struct {
	cfg PluginConfig
	Plugin
}

// Members tells the prober who is in its unit.
type Members interface {
	Current() membership.View
}

// Prober runs check rounds.
type Prober struct {
	cfg     Config
	self    string
	members Members
	link    *hublink.Link
	signer  events.Signer
	plugins []plugin
	log     *slog.Logger
	metrics *metrics
	epoch   string

	mu    sync.Mutex
	seq   uint64
	rtt   map[string]time.Duration
	unfit int // the unit size last warned about as not fitting the budget
	last  RoundStats
	// refused holds, by plugin, the last refusal of the plugin's
	// credentials, until a check of that plugin against the refusing peer
	// passes or that peer leaves the unit.
	refused map[string]*atollv1.ProbeRefusal
	// watchers are told when a plugin's credentials become refused or
	// stop being refused.
	watchers []chan struct{}
}

// RoundStats describes the last round.
type RoundStats struct {
	// Members in the view; Checked of them were checked to the end and
	// are in the report, the others were cut by the round's deadline.
	Members, Checked int
	// Workers checked members at once; Fits is false when Parallelism
	// workers could not fit the worst case in the budget.
	Workers int
	Fits    bool
	// Duration of the round, checks and report.
	Duration time.Duration
}

// LastRound describes the last round that ran.
func (p *Prober) LastRound() RoundStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// New returns the prober of node self, publishing over link the reports
// signer signs (the node's identity key, natsnode.Node).
func New(cfg Config, self string, members Members, link *hublink.Link, signer events.Signer, log *slog.Logger, m *metrics) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if signer == nil {
		return nil, errors.New("prober: no signer: peers drop unsigned reports")
	}
	p := &Prober{cfg: cfg, self: self, members: members, link: link, signer: signer, log: log.With("component", "prober"), metrics: m,
		epoch: strconv.FormatInt(time.Now().UnixNano(), 36), rtt: map[string]time.Duration{}, refused: map[string]*atollv1.ProbeRefusal{}}
	if p.metrics == nil {
		p.metrics = newMetrics(nil)
	}
	for _, pc := range cfg.Plugins {
		pc.Name = pc.name()
		pl, err := build(pc)
		if err != nil {
			return nil, fmt.Errorf("prober: %w", err)
		}
		p.plugins = append(p.plugins, plugin{cfg: pc, Plugin: pl})
	}
	return p, nil
}

// Run checks and reports every period until ctx is done.
func (p *Prober) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Period)
	defer t.Stop()
	for {
		if err := p.Round(ctx); err != nil && ctx.Err() == nil {
			p.log.Warn("probe report not sent", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Round checks every member once and publishes the report, within the
// round budget: at most Config.workers members are checked at once, and a
// member whose check is cut by the deadline is left out of the report
// (no opinion, rather than a false "abnormal"). A node in no unit checks
// nobody.
func (p *Prober) Round(ctx context.Context) error {
	view := p.members.Current()
	if view.Unit == "" || len(view.Members) == 0 {
		return nil
	}
	start := time.Now()
	targets := make([]Target, 0, len(view.Members))
	for _, m := range view.Members {
		if m.GetInternalIp() != "" {
			targets = append(targets, Target{Name: m.GetName(), IP: m.GetInternalIp()})
		}
	}
	workers, fits := p.cfg.workers(len(targets))
	p.noteFit(view.Unit, len(targets), workers, fits)
	p.pruneRefused(targets)

	// The checks' deadline leaves the reserve for the report.
	cctx, cancel := context.WithDeadline(ctx, start.Add(p.cfg.RoundBudget-reportReserve(p.cfg.RoundBudget)))
	defer cancel()
	checked := make([]*atollv1.PeerResult, len(targets))
	g := errgroup.Group{}
	g.SetLimit(max(workers, 1))
	for i, t := range targets {
		g.Go(func() error {
			if cctx.Err() != nil {
				return nil // out of time before it started
			}
			checked[i] = p.checkTarget(cctx, t)
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	results := slices.DeleteFunc(checked, func(r *atollv1.PeerResult) bool { return r == nil })
	if cut := len(targets) - len(results); cut > 0 {
		p.metrics.unchecked.Add(float64(cut))
	}

	p.mu.Lock()
	p.seq++
	r := &atollv1.ProbeReport{
		Checker:    p.self,
		Unit:       view.Unit,
		ReportTime: timestamppb.Now(),
		Sequence:   p.seq,
		Period:     durationpb.New(p.cfg.Period),
		Peers:      results,
	}
	p.mu.Unlock()

	abnormal := 0
	for _, res := range results {
		if !res.GetNormal() {
			abnormal++
		}
	}
	p.metrics.abnormal.Set(float64(abnormal))
	subj, err := events.ProbeSubject(view.Unit, p.self)
	if err != nil {
		return err
	}
	err = events.PublishSigned(p.link.Conn(), subj, r, p.self+"@"+p.epoch+"-"+strconv.FormatUint(r.GetSequence(), 10), p.signer)
	d := time.Since(start)
	p.metrics.round.Observe(d.Seconds())
	p.metrics.lastRound.Set(d.Seconds())
	p.mu.Lock()
	p.last = RoundStats{Members: len(targets), Checked: len(results), Workers: workers, Fits: fits, Duration: d}
	p.mu.Unlock()
	return err
}

// noteFit sets the fit metrics and warns once per unit size that does not
// fit the budget.
func (p *Prober) noteFit(unit string, members, workers int, fits bool) {
	p.metrics.workers.Set(float64(workers))
	if fits {
		p.metrics.fits.Set(1)
		p.mu.Lock()
		p.unfit = 0
		p.mu.Unlock()
		return
	}
	p.metrics.fits.Set(0)
	p.mu.Lock()
	warn := p.unfit != members
	p.unfit = members
	p.mu.Unlock()
	if warn {
		p.log.Warn("a probe round of this unit may not fit its budget; members not checked in time are left out of the report",
			"unit", unit, "members", members, "parallelism", p.cfg.Parallelism, "member_worst_case", p.cfg.memberWorstCase(),
			"round_budget", p.cfg.RoundBudget,
			"fix", "raise the prober's parallelism or round budget, or lower its plugin timeouts or retries")
	}
}

// checkTarget runs every plugin against t and scores it. Plugin details are
// kept only for peers that did not pass everything, keeping reports small.
func (p *Prober) checkTarget(ctx context.Context, t Target) *atollv1.PeerResult {
	res := &atollv1.PeerResult{Node: t.Name, Scoreline: p.cfg.Scoreline}
	details := make([]*atollv1.PluginResult, 0, len(p.plugins))
	allOK := true
	left := 0.0 // the most the plugins not yet run can add
	for _, pl := range p.plugins {
		left += 100 * pl.cfg.Weight
	}
	for _, pl := range p.plugins {
		left -= 100 * pl.cfg.Weight
		if res.Score+100*pl.cfg.Weight+left < p.cfg.Scoreline-1e-9 {
			// The peer cannot reach the scoreline any more: it is
			// abnormal whatever the rest says, and the round's time is
			// better spent on other members.
			details = append(details, &atollv1.PluginResult{Plugin: pl.cfg.Name, Weight: pl.cfg.Weight, Error: "skipped: scoreline out of reach"})
			allOK = false
			continue
		}
		pr := p.runPlugin(ctx, pl, t)
		if ctx.Err() != nil {
			// The round's deadline cut this check: no opinion.
			return nil
		}
		res.Score += pr.GetScore()
		allOK = allOK && pr.GetOk()
		details = append(details, pr)
	}
	res.Normal = res.Score >= p.cfg.Scoreline-1e-9
	if !allOK {
		res.Plugins = details
	}
	p.mu.Lock()
	if details[0].GetOk() && details[0].GetAttempts() > 0 {
		p.rtt[t.Name] = details[0].GetLatency().AsDuration()
	} else {
		delete(p.rtt, t.Name)
	}
	p.mu.Unlock()
	return res
}

func (p *Prober) runPlugin(ctx context.Context, pl plugin, t Target) *atollv1.PluginResult {
	pr := &atollv1.PluginResult{Plugin: pl.cfg.Name, Weight: pl.cfg.Weight}
	var err error
	for attempt := 0; attempt <= pl.cfg.Retries; attempt++ {
		pr.Attempts++
		actx, cancel := context.WithTimeout(ctx, pl.cfg.Timeout)
		start := time.Now()
		err = pl.Check(actx, t)
		pr.Latency = durationpb.New(time.Since(start))
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	var refused *Refused
	switch {
	case err == nil:
		pr.Ok, pr.Score = true, 100*pl.cfg.Weight
		p.metrics.checks.WithLabelValues(pl.cfg.Name, "ok").Inc()
		p.clearRefused(pl.cfg.Name, t.Name)
	case errors.As(err, &refused):
		// Alive: it counts. The error says what to fix.
		pr.Ok, pr.Score, pr.Error = true, 100*pl.cfg.Weight, err.Error()
		p.metrics.checks.WithLabelValues(pl.cfg.Name, "refused").Inc()
		p.noteRefused(pl.cfg.Name, t.Name, refused)
	default:
		pr.Error = err.Error()
		p.metrics.checks.WithLabelValues(pl.cfg.Name, "failed").Inc()
	}
	return pr
}

// noteRefused keeps the refusal as the plugin's last and warns, once per
// plugin until its checks pass again, that peers refuse the plugin's
// credentials.
func (p *Prober) noteRefused(plugin, peer string, r *Refused) {
	p.mu.Lock()
	_, warned := p.refused[plugin]
	p.refused[plugin] = &atollv1.ProbeRefusal{Plugin: plugin, Peer: peer, Status: r.Status}
	if !warned {
		p.notifyLocked()
	}
	p.mu.Unlock()
	if !warned {
		p.log.Warn("a peer refused the probe's credentials: counted as up (it answered), but the check cannot see its health",
			"plugin", plugin, "peer", peer, "status", r.Status,
			"fix", "grant the token get on nodes/healthz, or check the peer's link to the apiserver")
	}
}

// clearRefused forgets the plugin's refusal when it was peer's: a check
// of that peer passed. A pass against another peer leaves it (the peer
// that refused still refuses), so that peers that accept and peers that
// refuse the same credentials do not turn it on and off every round.
func (p *Prober) clearRefused(plugin, peer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.refused[plugin]; ok && r.GetPeer() == peer {
		delete(p.refused, plugin)
		p.notifyLocked()
	}
}

// pruneRefused forgets refusals by peers that are no longer checked.
func (p *Prober) pruneRefused(targets []Target) {
	p.mu.Lock()
	defer p.mu.Unlock()
	changed := false
	for plugin, r := range p.refused {
		if !slices.ContainsFunc(targets, func(t Target) bool { return t.Name == r.GetPeer() }) {
			delete(p.refused, plugin)
			changed = true
		}
	}
	if changed {
		p.notifyLocked()
	}
}

// notifyLocked tells the watchers that the set of refused plugins
// changed. Callers hold mu.
func (p *Prober) notifyLocked() {
	for _, w := range p.watchers {
		select {
		case w <- struct{}{}:
		default: // a change not yet read: this one coalesces with it
		}
	}
}

// Refusals are the last refusal of each plugin whose credentials peers
// refuse (until a check of that plugin against the refusing peer passes,
// or that peer leaves the unit), sorted by plugin, for
// the node's topology report.
func (p *Prober) Refusals() []*atollv1.ProbeRefusal {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*atollv1.ProbeRefusal, 0, len(p.refused))
	for _, r := range p.refused {
		out = append(out, &atollv1.ProbeRefusal{Plugin: r.GetPlugin(), Peer: r.GetPeer(), Status: r.GetStatus()})
	}
	slices.SortFunc(out, func(a, b *atollv1.ProbeRefusal) int { return strings.Compare(a.GetPlugin(), b.GetPlugin()) })
	return out
}

// RefusalChanges returns a channel that receives a value after a plugin's
// credentials become refused or stop being refused (changes may
// coalesce; read Refusals for the latest). A new refusal of a plugin
// already refused, by another peer or with another status, is not a
// change: it shows in the next periodic report.
func (p *Prober) RefusalChanges() <-chan struct{} {
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.watchers = append(p.watchers, ch)
	p.mu.Unlock()
	return ch
}

// RTTs are the latencies of the first plugin's last passing check of each
// peer, for the node's topology report.
func (p *Prober) RTTs() []*atollv1.PeerRTT {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*atollv1.PeerRTT, 0, len(p.rtt))
	for node, d := range p.rtt {
		if node != p.self {
			out = append(out, &atollv1.PeerRTT{Node: node, Rtt: durationpb.New(d)})
		}
	}
	slices.SortFunc(out, func(a, b *atollv1.PeerRTT) int { return strings.Compare(a.GetNode(), b.GetNode()) })
	return out
}
