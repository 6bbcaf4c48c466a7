package manager

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// renewingLock is a Lease this replica holds, whose first update
// conflicts: a renewal sent as the replica stopped landed between
// release's read and its update. Against a real apiserver
// (TestLeaderElection) that race is a matter of timing; this lock makes
// it certain.
type renewingLock struct {
	holder    string
	conflicts int
	updates   int
}

func (l *renewingLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return &resourcelock.LeaderElectionRecord{HolderIdentity: l.holder, LeaseDurationSeconds: 15}, nil, nil
}

func (l *renewingLock) Create(context.Context, resourcelock.LeaderElectionRecord) error {
	panic("release never creates the Lease")
}

func (l *renewingLock) Update(_ context.Context, rec resourcelock.LeaderElectionRecord) error {
	l.updates++
	if l.conflicts > 0 {
		l.conflicts--
		return apierrors.NewConflict(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "atoll-cloud", nil)
	}
	l.holder = rec.HolderIdentity
	return nil
}

func (l *renewingLock) RecordEvent(string) {}
func (l *renewingLock) Identity() string   { return "a" }
func (l *renewingLock) Describe() string   { return "kube-system/atoll-cloud" }

func TestReleaseReadsAgainOnConflict(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	lock := &renewingLock{holder: "a", conflicts: 1}
	release(lock, "a", time.Second, log)
	if lock.holder != "" {
		t.Fatalf("after a conflicting renewal the Lease is still held by %q (%d updates)", lock.holder, lock.updates)
	}
	other := &renewingLock{holder: "b"}
	release(other, "a", time.Second, log)
	if other.updates != 0 || other.holder != "b" {
		t.Fatalf("release touched a Lease another replica holds: holder %q, %d updates", other.holder, other.updates)
	}
}
