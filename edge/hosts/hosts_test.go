package hosts

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

func TestRender(t *testing.T) {
	tests := []struct {
		name string
		recs []*atollv1.HostRecord
		want string
	}{
		{"empty", nil, ""},
		{"one pod", []*atollv1.HostRecord{{Ip: "10.0.0.2", Hostnames: []string{"db-0.db.default.svc"}}}, "10.0.0.2 db-0.db.default.svc.example.org\n"},
		{"sorted, merged, deduplicated", []*atollv1.HostRecord{
			{Ip: "10.0.0.3", Hostnames: []string{"db-1.db.default.svc"}},
			{Ip: "10.0.0.2", Hostnames: []string{"db-0.db.default.svc", "alias.example"}},
			{Ip: "10.0.0.2", Hostnames: []string{"db-0.db.default.svc"}},
		}, "10.0.0.2 alias.example db-0.db.default.svc.example.org\n10.0.0.3 db-1.db.default.svc.example.org\n"},
		{"no ip or no name: left out", []*atollv1.HostRecord{{Ip: "", Hostnames: []string{"x.svc"}}, {Ip: "10.0.0.9"}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(Render(&atollv1.HostRecords{Unit: "u1", Records: tt.recs}, "example.org"))
			const header = "# StatefulSetGrid hosts of unit u1, written by atoll-edge (edge/hosts). Do not edit.\n"
			if got != header+tt.want {
				t.Fatalf("got\n%s\nwant\n%s", got, header+tt.want)
			}
		})
	}
}

type staticUnit string

func (u staticUnit) Unit() string           { return string(u) }
func (staticUnit) Changes() <-chan struct{} { return nil }

// TestWriterFollowsRecords: the writer of an edge in u1 writes u1's
// records (not u2's), rewrites the file when they change, leaves it alone
// when they do not, and a writer restarted with the hub down keeps the
// file intact.
func TestWriterFollowsRecords(t *testing.T) {
	h := natstest.Hub(t)
	cloud, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cloud.Close)
	cjs, err := jetstream.NewWithDomain(cloud, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := eventbus.EnsureStreams(ctx, cjs, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	publish := func(unit string, recs ...*atollv1.HostRecord) {
		subj, err := events.HostsSubject(unit)
		if err != nil {
			t.Fatal(err)
		}
		m := &atollv1.HostRecords{Unit: unit, Records: recs}
		if _, err := events.PublishDurable(ctx, cjs, subj, m, fmt.Sprint(subj, "@", time.Now().UnixNano())); err != nil {
			t.Fatal(err)
		}
	}
	publish("u1", &atollv1.HostRecord{Ip: "10.0.1.5", Hostnames: []string{"db-0.db.default.svc"}})
	publish("u2", &atollv1.HostRecord{Ip: "10.0.2.5", Hostnames: []string{"db-0.db.default.svc"}})

	edge := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "a1")[0]
	nc, err := edge.Connect("hosts")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "coredns", "atoll.hosts")
	cfg := Config{Path: path, ClusterDomain: "cluster.local"}
	feeds, err := viewfeed.NewFeeds(viewfeed.DefaultConfig(), hublink.Of(nc, js), edge, natstest.Logger(t, slog.LevelWarn), nil)
	if err != nil {
		t.Fatal(err)
	}
	run := func() (*Writer, func()) {
		w, err := New(cfg, feeds, staticUnit("u1"), natstest.Logger(t, slog.LevelWarn))
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(rctx) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		return w, stop
	}
	has := func(want string) func() error {
		return func() error {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			if got := string(Render(&atollv1.HostRecords{Unit: "u1"}, "")) + want; string(b) != got {
				return fmt.Errorf("file holds %q, want %q", b, got)
			}
			return nil
		}
	}
	w, stop := run()
	poll.Eventually(t, 20*time.Second, has("10.0.1.5 db-0.db.default.svc.cluster.local\n"))

	publish("u1", &atollv1.HostRecord{Ip: "10.0.1.6", Hostnames: []string{"db-0.db.default.svc"}}, &atollv1.HostRecord{Ip: "10.0.1.7", Hostnames: []string{"db-1.db.default.svc"}})
	poll.Eventually(t, 20*time.Second, has("10.0.1.6 db-0.db.default.svc.cluster.local\n10.0.1.7 db-1.db.default.svc.cluster.local\n"))
	writes := w.Writes()
	publish("u1", &atollv1.HostRecord{Ip: "10.0.1.7", Hostnames: []string{"db-1.db.default.svc"}}, &atollv1.HostRecord{Ip: "10.0.1.6", Hostnames: []string{"db-0.db.default.svc"}})
	publish("u1", &atollv1.HostRecord{Ip: "10.0.1.6", Hostnames: []string{"db-0.db.default.svc"}}, &atollv1.HostRecord{Ip: "10.0.1.7", Hostnames: []string{"db-1.db.default.svc"}})
	// A marker after the same records: once the file shows it, both were handled.
	publish("u1", &atollv1.HostRecord{Ip: "10.0.1.6", Hostnames: []string{"db-0.db.default.svc"}}, &atollv1.HostRecord{Ip: "10.0.1.8", Hostnames: []string{"db-1.db.default.svc"}})
	poll.Eventually(t, 20*time.Second, has("10.0.1.6 db-0.db.default.svc.cluster.local\n10.0.1.8 db-1.db.default.svc.cluster.local\n"))
	if got := w.Writes(); got != writes+1 {
		t.Fatalf("%d writes for two unchanged record sets and one change, want 1", got-writes)
	}

	// Hub down, writer restarted: the file stays as it was.
	stop()
	if err := h.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	run()
	time.Sleep(500 * time.Millisecond) // a window in which a broken writer would truncate it
	after, err := os.ReadFile(path)
	if err != nil || string(after) != string(before) {
		t.Fatalf("hosts file changed after a restart with the hub down: %q → %q (%v)", before, after, err)
	}
}

// TestWriterKeepsWhatTheDiskRefused: records that arrive while the
// file cannot be written (here its directory is a file; a full disk on
// real nodes) are written once it can be, though no new records come.
func TestWriterKeepsWhatTheDiskRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "coredns")
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := New(Config{Path: filepath.Join(dir, "atoll.hosts"), ClusterDomain: "cluster.local"}, nil, staticUnit("u1"), natstest.Logger(t, slog.LevelError))
	if err != nil {
		t.Fatal(err)
	}
	recs := &atollv1.HostRecords{Unit: "u1", Records: []*atollv1.HostRecord{{Ip: "10.0.0.1", Hostnames: []string{"db-0.db.soak.svc"}}}}
	if err := w.Apply(recs); err == nil {
		t.Fatal("written into a file's place")
	}
	w.retry()
	if w.Writes() != 0 {
		t.Fatal("written while the disk refuses")
	}
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	w.retry()
	b, err := os.ReadFile(filepath.Join(dir, "atoll.hosts"))
	if err != nil || string(b) != string(Render(recs, "cluster.local")) || w.Writes() != 1 {
		t.Fatalf("after the disk took it again: %d writes, %q, %v", w.Writes(), b, err)
	}
	w.retry()
	if w.Writes() != 1 {
		t.Fatal("written again with nothing pending")
	}
}
