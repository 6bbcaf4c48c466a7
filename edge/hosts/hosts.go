// Package hosts keeps a CoreDNS hosts-plugin file with the StatefulSetGrid
// DNS names of the node's unit: the cloud publishes the unit's HostRecords
// (atoll.view.<unit>.hosts._.<unit>, the full set each time), mapping
// <ssg>-<i>.<svc>.<ns>.svc to the IP of the pod <ssg>-<unit>-<i> of the
// unit, and the writer renders them, with the cluster domain appended,
// into one file replaced atomically (temporary file, fsync, rename), so
// CoreDNS never reads half a file. The file is the writer's state: after a
// restart with the hub down it is left as it is (and keeps being served)
// until the next records arrive.
package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/atomicfile"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Config tunes the hosts writer.
type Config struct {
	// Path of the hosts file CoreDNS reads (empty: no writer).
	Path string
	// ClusterDomain is appended to every record name ending in ".svc".
	ClusterDomain string
}

// DefaultConfig suits production (with --hosts-file set).
func DefaultConfig() Config { return Config{ClusterDomain: "cluster.local"} }

// Validate names the first bad field.
func (c Config) Validate() error {
	if c.Path == "" {
		return nil
	}
	if !filepath.IsAbs(c.Path) {
		return fmt.Errorf("hosts: Path %q must be absolute", c.Path)
	}
	if c.ClusterDomain == "" || strings.HasPrefix(c.ClusterDomain, ".") || strings.HasSuffix(c.ClusterDomain, ".") {
		return fmt.Errorf("hosts: ClusterDomain %q must be a domain without leading or trailing dot", c.ClusterDomain)
	}
	return nil
}

// UnitSource tells the writer the node's current unit (edge/membership).
type UnitSource interface {
	Unit() string
	Changes() <-chan struct{}
}

// Writer keeps the hosts file of the node's unit.
type Writer struct {
	cfg   Config
	feeds *viewfeed.Feeds
	units UnitSource
	log   *slog.Logger

	mu      sync.Mutex
	last    []byte // content last written or found
	pending []byte // content the disk refused, written again by Run
	writes  int
}

// writeRetry is how often Run writes again a file the disk refused.
const writeRetry = 10 * time.Second

// New returns a writer following the records with a feed of feeds.
func New(cfg Config, feeds *viewfeed.Feeds, units UnitSource, log *slog.Logger) (*Writer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Path == "" {
		return nil, errors.New("hosts: no path")
	}
	w := &Writer{cfg: cfg, feeds: feeds, units: units, log: log.With("component", "hosts")}
	if b, err := os.ReadFile(cfg.Path); err == nil {
		w.last = b
	}
	return w, nil
}

// Render is the hosts file of recs: one line per IP, its names sorted,
// the lines sorted by IP, ".svc" names completed with the cluster domain.
func Render(recs *atollv1.HostRecords, clusterDomain string) []byte {
	type line struct {
		ip    string
		names []string
	}
	byIP := map[string][]string{}
	for _, r := range recs.GetRecords() {
		for _, n := range r.GetHostnames() {
			if strings.HasSuffix(n, ".svc") {
				n += "." + clusterDomain
			}
			if !slices.Contains(byIP[r.GetIp()], n) {
				byIP[r.GetIp()] = append(byIP[r.GetIp()], n)
			}
		}
	}
	var lines []line
	for ip, names := range byIP {
		if ip == "" || len(names) == 0 {
			continue
		}
		slices.Sort(names)
		lines = append(lines, line{ip, names})
	}
	slices.SortFunc(lines, func(a, b line) int { return strings.Compare(a.ip, b.ip) })
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# StatefulSetGrid hosts of unit %s, written by atoll-edge (edge/hosts). Do not edit.\n", recs.GetUnit())
	for _, l := range lines {
		fmt.Fprintf(&buf, "%s %s\n", l.ip, strings.Join(l.names, " "))
	}
	return buf.Bytes()
}

// Apply writes the file for recs, unless it already holds exactly that.
func (w *Writer) Apply(recs *atollv1.HostRecords) error {
	b := Render(recs, w.cfg.ClusterDomain)
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Equal(b, w.last) {
		w.pending = nil
		return nil
	}
	if err := writeAtomic(w.cfg.Path, b); err != nil {
		// Kept: Run writes it once the disk takes it.
		w.pending = b
		return err
	}
	w.pending = nil
	w.last = b
	w.writes++
	w.log.Info("hosts file written", "path", w.cfg.Path, "unit", recs.GetUnit(), "records", len(recs.GetRecords()))
	return nil
}

// retry writes the content the disk last refused, if any.
func (w *Writer) retry() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending == nil {
		return
	}
	if err := writeAtomic(w.cfg.Path, w.pending); err != nil {
		return
	}
	w.last, w.pending = w.pending, nil
	w.writes++
	w.log.Info("hosts file written after the disk refused it", "path", w.cfg.Path)
}

// keepRetrying calls retry every writeRetry until ctx is done.
func (w *Writer) keepRetrying(ctx context.Context) {
	t := time.NewTicker(writeRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.retry()
		}
	}
}

// Writes counts the files written.
func (w *Writer) Writes() int { w.mu.Lock(); defer w.mu.Unlock(); return w.writes }

// writeAtomic replaces the hosts file at path with b, readable by the
// DNS server that serves it (its directory made 0755 if missing).
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("hosts: %w", err)
	}
	return nil
}

// Run follows the records of the node's unit until ctx is done. A unit
// change switches the feed; records of another unit are ignored. Applying
// is idempotent (a file that holds the records is left alone), as the
// feed requires.
func (w *Writer) Run(ctx context.Context) error {
	retryCtx, stopRetrying := context.WithCancel(ctx)
	retrying := make(chan struct{})
	go func() {
		defer close(retrying)
		w.keepRetrying(retryCtx)
	}()
	defer func() { stopRetrying(); <-retrying }()
	changes := w.units.Changes()
	for ctx.Err() == nil {
		unit := w.units.Unit()
		if unit == "" {
			select {
			case <-ctx.Done():
				return nil
			case <-changes:
				continue
			}
		}
		subj, err := events.HostsSubject(unit)
		if err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
		feed, err := w.feeds.New(viewfeed.Options{Name: "hosts", Filter: subj,
			Apply: func(_ context.Context, m viewfeed.Msg) error {
				var recs atollv1.HostRecords
				if err := events.DecodeMsg(&nats.Msg{Subject: m.Subject, Header: m.Header, Data: m.Data}, &recs); err != nil {
					return err
				}
				if recs.GetUnit() != unit {
					return fmt.Errorf("records of unit %q on %s", recs.GetUnit(), m.Subject)
				}
				return w.Apply(&recs)
			}})
		if err != nil {
			return fmt.Errorf("hosts: %w", err)
		}
		uctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- feed.Run(uctx) }()
		for waiting := true; waiting; {
			select {
			case err := <-done:
				if err != nil {
					cancel()
					return fmt.Errorf("hosts: %w", err)
				}
				waiting = false
			case <-changes:
				if w.units.Unit() != unit {
					cancel()
					if err := <-done; err != nil {
						w.log.Warn("the old unit's host records feed ended with an error", "unit", unit, "err", err)
					}
					waiting = false
				}
			}
		}
		cancel()
	}
	return nil
}
