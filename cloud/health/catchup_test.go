package health

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestNoWriteBeforeCatchUp: a replica whose vote follower has not caught
// up with the stream (here: not even started, as on a new leader's first
// reconciles) defers every reconcile instead of reading the cache and
// writing a verdict built from a partial vote state.
func TestNoWriteBeforeCatchUp(t *testing.T) {
	s := &Service{metrics: newMetrics(nil), tracker: NewTracker(time.Minute), now: time.Now}
	if err := s.Ready(t.Context()); err == nil {
		t.Fatal("ready without a vote follower")
	}
	// s has no cache and no patcher: a reconcile that went on would panic.
	res, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "edge-1"}})
	if err != nil || res.RequeueAfter <= 0 {
		t.Fatalf("Reconcile = %+v, %v; want a deferral", res, err)
	}
	var m dto.Metric
	if err := s.metrics.deferred.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Fatalf("deferred reconciles = %v, want 1", got)
	}
}
