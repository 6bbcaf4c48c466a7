package proxy

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/poll"
)

func save(t *testing.T, s *Store, dir string) {
	t.Helper()
	if _, err := s.Save(dir); err != nil {
		t.Fatal(err)
	}
}

func snapshotOf(t *testing.T, s *Store) *atollv1.ProxyState {
	t.Helper()
	st, err := s.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return proto.Clone(st).(*atollv1.ProxyState)
}

// loaded is the state a new store loads from dir.
func loaded(t *testing.T, dir string) (*Store, *atollv1.ProxyState) {
	t.Helper()
	s := NewStore("a1", 100, nil)
	ok, err := s.Load(dir)
	if err != nil || !ok {
		t.Fatalf("load: %v, %v", ok, err)
	}
	return s, snapshotOf(t, s)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func feedBase(t *testing.T, s *Store) {
	t.Helper()
	feed(t, s, testNode("a1", map[string]string{zone: "A"}), testNode("a2", map[string]string{zone: "A"}),
		testNode("b1", map[string]string{zone: "B"}), testService("web", zone, false), testSlice("web-1", "web", "a1", "b1"))
}

// TestStateLogTornRecord: after the first snapshot a save appends only
// what changed to the log (the snapshot is not written again, nothing is
// written when nothing changed); a log cut anywhere inside its last record
// (a crash in the middle of an append) loads as the state before that
// record, and the next save after such a load leaves a state that loads
// whole.
func TestStateLogTornRecord(t *testing.T) {
	dir := t.TempDir()
	s := NewStore("a1", 100, nil)
	feedBase(t, s)
	save(t, s, dir)
	snap, err := os.ReadFile(filepath.Join(dir, StateFile))
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, LogFile)

	feed(t, s, testSlice("web-1", "web", "a1", "a2", "b1"))
	save(t, s, dir)
	want := snapshotOf(t, s)
	first := fileSize(t, logPath)
	if first == 0 {
		t.Fatal("a change was not appended to the log")
	}
	save(t, s, dir)
	if got := fileSize(t, logPath); got != first {
		t.Fatalf("a save with nothing changed wrote %d bytes", got-first)
	}
	feed(t, s, testSlice("web-2", "web", "a2"))
	save(t, s, dir)
	if again, _ := os.ReadFile(filepath.Join(dir, StateFile)); !slices.Equal(again, snap) {
		t.Fatal("the snapshot was written again for a change")
	}
	full, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, got := loaded(t, dir); !proto.Equal(got, snapshotOf(t, s)) {
		t.Fatal("snapshot + log do not load as the state saved")
	}

	for cut := first + 1; cut < int64(len(full)); cut++ {
		if err := os.WriteFile(logPath, full[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		if _, got := loaded(t, dir); !proto.Equal(got, want) {
			t.Fatalf("log cut at %d of %d (last record from %d): not the state before the last record", cut, len(full), first)
		}
	}

	// A torn log loaded, changed and saved: everything loads.
	l, _ := loaded(t, dir)
	feed(t, l, testSlice("web-3", "web", "b1"))
	save(t, l, dir)
	if _, got := loaded(t, dir); !proto.Equal(got, snapshotOf(t, l)) {
		t.Fatal("after a torn log, a save did not leave a state that loads whole")
	}
	if got := servedNodes(t, l, "web-1"); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Fatalf("web-1 served on %v", got)
	}
}

// TestStateCrashBetweenSnapshotAndLog: a compaction writes a new snapshot
// and then empties the log; a process killed between the two (or while
// writing the snapshot's temporary file) leaves records of the previous
// generation, which a load ignores (replaying them would bring back an
// older state of web-1), also when records of the new generation follow.
func TestStateCrashBetweenSnapshotAndLog(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, LogFile)
	s := NewStore("a1", 100, nil)
	feedBase(t, s)
	save(t, s, dir)
	feed(t, s, testSlice("web-1", "web", "a1"))
	save(t, s, dir)
	old, err := os.ReadFile(logPath)
	if err != nil || len(old) == 0 {
		t.Fatalf("log: %d bytes, %v", len(old), err)
	}

	feed(t, s, testSlice("web-1", "web", "a1", "a2"))
	s.mu.Lock()
	s.dirty.full = true // a compaction is due
	s.mu.Unlock()
	save(t, s, dir)
	if got := fileSize(t, logPath); got != 0 {
		t.Fatalf("log of %d bytes after a compaction", got)
	}
	// Killed before the log was emptied, and while writing the next
	// snapshot.
	if err := os.WriteFile(logPath, old, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, StateFile+".tmp-123"), []byte("torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, got := loaded(t, dir)
	if !proto.Equal(got, snapshotOf(t, s)) {
		t.Fatal("records of the previous generation were replayed over the new snapshot")
	}
	if nodes := servedNodes(t, l, "web-1"); !slices.Equal(nodes, []string{"a1", "a2"}) {
		t.Fatalf("web-1 served on %v, want the snapshot's [a1 a2]", nodes)
	}
	feed(t, l, testSlice("web-1", "web", "a2"))
	save(t, l, dir)
	l2, got := loaded(t, dir)
	if !proto.Equal(got, snapshotOf(t, l)) {
		t.Fatal("records appended after stale ones did not load")
	}
	if nodes := servedNodes(t, l2, "web-1"); !slices.Equal(nodes, []string{"a2"}) {
		t.Fatalf("web-1 served on %v, want [a2]", nodes)
	}
}

// TestStateCompaction: the log is folded into a new snapshot once it
// grows past the snapshot's size, and the state loads whole throughout.
func TestStateCompaction(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, LogFile)
	s := NewStore("a1", 100, nil)
	feedBase(t, s)
	save(t, s, dir)
	compacted := false
	var last int64
	for i := range 40 {
		nodes := []string{"a1", "a2", "b1"}[:1+i%3]
		feed(t, s, testSlice("web-1", "web", nodes...))
		save(t, s, dir)
		n := fileSize(t, logPath)
		if n < last {
			compacted = true
		}
		last = n
		if snap := fileSize(t, filepath.Join(dir, StateFile)); n > 2*snap {
			t.Fatalf("log of %d bytes beside a snapshot of %d", n, snap)
		}
	}
	if !compacted {
		t.Fatal("the log was never compacted")
	}
	if _, got := loaded(t, dir); !proto.Equal(got, snapshotOf(t, s)) {
		t.Fatal("the state does not load as saved")
	}
}

// TestKeepWritesWhatTheDiskRefused: views the disk refuses (here the
// state directory is a file; a full disk on real nodes) are written once
// it takes them again, though no view changes meanwhile; views applied
// before the writer starts (the proxy follows the hub beside it) are
// written too.
func TestKeepWritesWhatTheDiskRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(dir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.StateDir, cfg.SaveRetry = dir, 50*time.Millisecond
	s := NewStore("a1", 100, newMetrics(nil))
	p := &Proxy{cfg: cfg, store: s, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	feedBase(t, s)
	go func() { defer close(done); p.keep(ctx) }()
	time.Sleep(5 * cfg.SaveRetry)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 5*time.Second, func() error {
		_, err := os.Stat(filepath.Join(dir, StateFile))
		return err
	})
	cancel()
	<-done
	if _, got := loaded(t, dir); !proto.Equal(got, snapshotOf(t, s)) {
		t.Fatal("the state does not load as the store holds it")
	}
}
