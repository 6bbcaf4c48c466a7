package chaos

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/gobuild"
	"github.com/atoll-edge/atoll/test/kubenode"
)

// fleetNet is this package's kubenode fleet (bridge kn8).
const fleetNet = 8

// TestChaosShort keeps the soak's machinery alive: three minutes of seed
// 1609's schedule (edge-b1's state disk full for 1 min 19 s, unit a cut
// from the cloud for 1 min 49 s) on two units of three real nodes, the
// checker in a process of its own; no invariant may break, the hub's
// servers are read, and the report is written.
func TestChaosShort(t *testing.T) {
	if err := kubenode.Prerequisites(); err != nil {
		t.Skip(err)
	}
	bin, err := gobuild.Binary(t.Context(), "services/atoll-soak")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	o := Options{Dir: dir, Seed: 1609, Duration: 3 * time.Minute, Shape: ShapeEmbedded, Units: 2, Nodes: 3, Net: fleetNet,
		Warmup: 30 * time.Second, Checker: []string{bin, "check", "--dir", dir},
		Logger: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))}
	s := MakeSchedule(o.Seed, o.Duration, o.Topo())
	if c := s.Counts(); c[UnitCut] != 1 || c[DiskFull] != 1 || len(s.Faults) != 2 {
		t.Fatalf("seed 1609's schedule changed; pick a seed with a unit cut and a full disk again:\n%s", s)
	}
	r, err := Soak(t.Context(), o)
	if err != nil {
		if b, rerr := os.ReadFile(filepath.Join(dir, "checker.log")); rerr == nil {
			t.Logf("checker:\n%s", b)
		}
		t.Fatalf("%v\n%s", err, Summary(r))
	}
	t.Logf("\n%s", Summary(r))
	if len(r.Played) != 2 || r.Calls["a"].CutOK == 0 {
		t.Errorf("want both faults played and unit a's client served while cut off: %d played, %+v", len(r.Played), r.Calls["a"])
	}
	// The hub was read: the ballots' stream and Atoll's durable consumers.
	var stream, consumers bool
	for _, sm := range r.Samples {
		for _, h := range sm.Hub {
			stream = stream || h.Streams[AckedStream].LastSeq > 0
			consumers = consumers || len(h.Consumers) > 0
		}
	}
	if r.Bounds.HubSamples == 0 || !stream || !consumers {
		t.Errorf("the hub's monitoring: read %d times, %s stream seen %v, durable consumers seen %v", r.Bounds.HubSamples, AckedStream, stream, consumers)
	}
	for _, f := range []string{ReportFile, SummaryFile, SamplesFile} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
