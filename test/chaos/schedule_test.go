package chaos

import (
	"reflect"
	"testing"
	"time"
)

func topo(shape string) Topology {
	return Options{Units: 6, Nodes: 4, Shape: shape}.Topo()
}

// The same seed gives the same schedule; another seed another one.
func TestScheduleReplays(t *testing.T) {
	a := MakeSchedule(42, 2*time.Hour, topo(ShapeEmbedded))
	b := MakeSchedule(42, 2*time.Hour, topo(ShapeEmbedded))
	if !reflect.DeepEqual(a, b) || a.String() != b.String() {
		t.Fatalf("seed 42 gave two schedules:\n%s\n%s", a, b)
	}
	if c := MakeSchedule(43, 2*time.Hour, topo(ShapeEmbedded)); reflect.DeepEqual(a.Faults, c.Faults) {
		t.Fatal("seeds 42 and 43 gave the same schedule")
	}
}

// A unit has one fault at a time and Settle after it, the cloud one at
// a time; nothing is in force in a lull or after the run; every kind
// shows up in two hours, the hub's servers only in the cluster shape.
func TestScheduleKeepsFaultsApart(t *testing.T) {
	for _, shape := range []string{ShapeEmbedded, ShapeCluster} {
		for seed := uint64(1); seed <= 20; seed++ {
			d := 2 * time.Hour
			s := MakeSchedule(seed, d, topo(shape))
			if len(s.Faults) < 100 {
				t.Errorf("%s seed %d: only %d faults in %s", shape, seed, len(s.Faults), d)
			}
			busy := map[string]time.Duration{}
			for i, f := range s.Faults {
				if f.ID != i+1 {
					t.Errorf("fault %d has ID %d", i+1, f.ID)
				}
				if f.At+f.For > d || inLull(f.At, f.At+f.For, d) {
					t.Errorf("%s seed %d: %s meets a lull or the run's end", shape, seed, f)
				}
				if f.Kind == HubKill && shape != ShapeCluster {
					t.Errorf("%s seed %d: %s without hub servers", shape, seed, f)
				}
				units := []string{f.Unit, f.To}
				if f.Unit == "" {
					units = []string{"cloud"}
				}
				for _, u := range units {
					if u == "" {
						continue
					}
					if busy[u] > f.At {
						t.Errorf("%s seed %d: %s while unit %s is busy until %s", shape, seed, f, u, busy[u])
					}
					busy[u] = f.At + f.For
					if u != "cloud" {
						busy[u] += Settle
					}
				}
				if f.Unit != "" && (f.Kind == UnitCut || f.Kind == UnitReboot) != (f.Node == "") {
					t.Errorf("%s seed %d: %s: node %q", shape, seed, f, f.Node)
				}
			}
		}
	}
	counts := map[Kind]int{}
	for seed := uint64(1); seed <= 5; seed++ {
		for k, n := range MakeSchedule(seed, 2*time.Hour, topo(ShapeCluster)).Counts() {
			counts[k] += n
		}
	}
	for _, w := range weights {
		if counts[w.kind] == 0 {
			t.Errorf("no %s in five two-hour cluster schedules: %v", w.kind, counts)
		}
	}
}
