// Package prober checks the node's unit peers every period with weighted
// check plugins and publishes one ProbeReport per round on
// atoll.health.probe.<unit>.<self>. A peer is normal when its score, the
// sum of 100*weight over the plugins that passed, reaches the scoreline.
//
// The node checks itself too: a unit of four split two against two then
// gives every node two normal and two abnormal reports, and no verdict,
// rather than a verdict of whichever half the node sits in.
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
	// Scoreline is the score a peer needs to be normal.
	Scoreline float64
	// Parallelism bounds the checks running at once.
	Parallelism int
	// Plugins run against every peer each round.
	Plugins []PluginConfig
}

// DefaultConfig checks the kubelet's port and its /healthz every 2 s.
func DefaultConfig() Config {
	return Config{
		Period:      2 * time.Second,
		Scoreline:   100,
		Parallelism: 16,
		Plugins: []PluginConfig{
			{Kind: "tcp", Name: "kubelet-port", Weight: 0.5, Timeout: time.Second, Retries: 1, Port: 10250},
			{Kind: "http", Name: "kubelet-healthz", Weight: 0.5, Timeout: time.Second, Retries: 1, Port: 10250,
				Scheme: "https", Path: "/healthz", InsecureSkipVerify: true},
		},
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.Period <= 0 {
		return errors.New("prober: period must be positive")
	}
	if c.Parallelism < 1 {
		return errors.New("prober: parallelism must be at least 1")
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
	return nil
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
	plugins []plugin
	log     *slog.Logger
	metrics *metrics
	epoch   string

	mu  sync.Mutex
	seq uint64
	rtt map[string]time.Duration
}

// New returns the prober of node self, publishing over link.
func New(cfg Config, self string, members Members, link *hublink.Link, log *slog.Logger, m *metrics) (*Prober, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Prober{cfg: cfg, self: self, members: members, link: link, log: log.With("component", "prober"), metrics: m,
		epoch: strconv.FormatInt(time.Now().UnixNano(), 36), rtt: map[string]time.Duration{}}
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

// Round checks every member once and publishes the report. A node in no
// unit checks nobody.
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
	results := make([]*atollv1.PeerResult, len(targets))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(p.cfg.Parallelism)
	for i, t := range targets {
		g.Go(func() error {
			results[i] = p.checkTarget(gctx, t)
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	p.metrics.round.Observe(time.Since(start).Seconds())

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
	return events.Publish(p.link.Conn(), subj, r, p.self+"@"+p.epoch+"-"+strconv.FormatUint(r.GetSequence(), 10))
}

// checkTarget runs every plugin against t and scores it. Plugin details are
// kept only for peers that did not pass everything, keeping reports small.
func (p *Prober) checkTarget(ctx context.Context, t Target) *atollv1.PeerResult {
	res := &atollv1.PeerResult{Node: t.Name, Scoreline: p.cfg.Scoreline}
	details := make([]*atollv1.PluginResult, 0, len(p.plugins))
	allOK := true
	for _, pl := range p.plugins {
		pr := p.runPlugin(ctx, pl, t)
		res.Score += pr.GetScore()
		allOK = allOK && pr.GetOk()
		details = append(details, pr)
	}
	res.Normal = res.Score >= p.cfg.Scoreline-1e-9
	if !allOK {
		res.Plugins = details
	}
	p.mu.Lock()
	if details[0].GetOk() {
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
	if err == nil {
		pr.Ok, pr.Score = true, 100*pl.cfg.Weight
		p.metrics.checks.WithLabelValues(pl.cfg.Name, "ok").Inc()
	} else {
		pr.Error = err.Error()
		p.metrics.checks.WithLabelValues(pl.cfg.Name, "failed").Inc()
	}
	return pr
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
