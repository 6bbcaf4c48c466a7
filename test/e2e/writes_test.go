package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/testbed"
)

// steadyFor is how long the write count watches a cluster where nothing
// changes: no atoll-cloud write may happen in it.
const steadyFor = 45 * time.Second

// TestOneWritePerVerdict counts, in the kube-apiserver's audit log, the
// writes of field manager atoll-cloud while a lost node's verdict flips
// from unhealthy to healthy: the node lifecycle controller has tainted it
// unreachable:NoExecute and marked its pod's endpoints not ready (nothing
// protected it), and the healthy verdict must undo both through the
// reconciler. Each verdict state the cloud writes to the node is one
// patch: annotations and the taint together, never one patch each; and
// the EndpointSlice and Endpoints take at most one patch per verdict.
// Then nothing changes for steadyFor: atoll-cloud writes nothing at all.
func TestOneWritePerVerdict(t *testing.T) {
	dir := t.TempDir()
	auditDir := filepath.Join(dir, "audit")
	flags, err := kubetest.Audit(auditDir)
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "atoll.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = logFile.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	faults := newFaults(t)
	bed, err := testbed.Start(ctx, testbed.Options{
		Dir:    filepath.Join(dir, "bed"),
		Net:    3,
		Logger: slog.New(slog.NewJSONHandler(logFile, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Kube: kubetest.Config{UnreachableTolerationSeconds: 60, NotReadyTolerationSeconds: 60,
			ExtraAPIServerFlags: flags},
		Cloud: func(c *cloudapp.Config) { c.Health.HoldTime = holdTime },
		Agent: faults.agents,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("atoll log: %s\n%s", logFile.Name(), bed.Cluster.LogTails(40))
		}
		bed.Stop()
	})
	e := &env{bed: bed, client: bed.Cluster.Client(), faults: faults}

	nodes := e.site(t, "w1", 3, true)
	x := nodes[0]
	// The peers cannot probe x: they vote it unhealthy.
	for _, p := range nodes[1:] {
		e.faults.block(x, p)
	}
	poll.Eventually(t, 30*time.Second, func() error { return e.verdict(x, "unhealthy") })
	// x loses the cloud: KCM marks it Unknown, taints it NoExecute and
	// its endpoints not ready; nothing protects it.
	e.partition(t, x)
	e.waitUnknown(t, x)
	poll.Eventually(t, 30*time.Second, func() error {
		n, err := e.node(x)
		if err != nil {
			return err
		}
		if !hasTaint(n, corev1.TaintEffectNoExecute) {
			return fmt.Errorf("%s not tainted NoExecute yet", x)
		}
		if ok, err := e.endpointReady("w1", "web-"+x); err != nil || ok {
			return fmt.Errorf("endpoint of web-%s still ready (%v)", x, err)
		}
		return nil
	})
	// The peers reach x again: healthy, and the reconciler undoes it.
	for _, p := range nodes[1:] {
		e.faults.unblock(x, p)
	}
	poll.Eventually(t, 40*time.Second, func() error {
		n, err := e.node(x)
		if err != nil {
			return err
		}
		if err := e.verdict(x, "healthy"); err != nil {
			return err
		}
		if hasTaint(n, corev1.TaintEffectNoExecute) {
			return fmt.Errorf("%s still tainted NoExecute", x)
		}
		if ok, err := e.endpointReady("w1", "web-"+x); err != nil || !ok {
			return fmt.Errorf("endpoint of web-%s not ready (%v)", x, err)
		}
		if ok, err := e.endpointsAddressReady("w1", "web-"+x); err != nil || !ok {
			return fmt.Errorf("Endpoints address of web-%s not ready (%v)", x, err)
		}
		return nil
	})

	// Nothing changes now (x stays cut and protected, its peers healthy,
	// KCM keeps re-applying its view through the webhook): atoll-cloud
	// writes nothing at all. The vote counts still move with every probe
	// round; they are not written.
	writes := func() (map[string]int, error) {
		events, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
		if err != nil {
			return nil, err
		}
		return kubetest.Writes(events, wellknown.FieldManager), nil
	}
	var settled map[string]int
	quietSince := time.Now()
	poll.Eventually(t, 30*time.Second, func() error {
		w, err := writes()
		if err != nil {
			return err
		}
		if !maps.Equal(w, settled) {
			settled, quietSince = w, time.Now()
		}
		if time.Since(quietSince) < 3*time.Second {
			return fmt.Errorf("atoll-cloud still writing: %v", w)
		}
		return nil
	})
	holdsFor(t, steadyFor, func() error {
		w, err := writes()
		if err != nil {
			return err
		}
		if !maps.Equal(w, settled) {
			return fmt.Errorf("atoll-cloud wrote in steady state: %v, was %v", w, settled)
		}
		return nil
	})

	events, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
	if err != nil {
		t.Fatal(err)
	}
	// Every atoll-cloud write of x leaves a new verdict state: a write
	// that leaves the managed annotations as the previous one did is a
	// second patch for one verdict.
	var states []string
	taintRemoved := false
	others := map[string]int{}
	for _, ev := range events {
		if ev.FieldManager() != wellknown.FieldManager || ev.ResponseStatus.Code/100 != 2 {
			continue
		}
		if ev.ObjectRef.Resource != "nodes" {
			if ev.ObjectRef.Namespace == "w1" {
				others[ev.Object()]++
			}
			continue
		}
		if ev.ObjectRef.Name != x {
			continue
		}
		var n corev1.Node
		if err := json.Unmarshal(ev.ResponseObject, &n); err != nil {
			t.Fatalf("audit response object: %v", err)
		}
		st := managedState(&n)
		if len(states) > 0 && states[len(states)-1] == st {
			t.Errorf("two atoll-cloud writes of %s for one verdict state %s", x, st)
		}
		states = append(states, st)
		if !hasTaint(&n, corev1.TaintEffectNoExecute) && strings.Contains(st, "verdict=healthy") {
			taintRemoved = true
		}
	}
	if !taintRemoved {
		t.Errorf("no atoll-cloud write of %s removed the taint with the healthy verdict; states %v", x, states)
	}
	// The slice and Endpoints of w1 were written at most once per verdict
	// state of x (here: for the healthy one).
	healthy := 0
	for _, st := range states {
		if strings.Contains(st, "verdict=healthy") {
			healthy++
		}
	}
	for obj, n := range others {
		if n > max(healthy, 1) {
			t.Errorf("%s: %d atoll-cloud writes for %d healthy verdict states of %s", obj, n, healthy, x)
		}
	}
	t.Logf("atoll-cloud writes of %s: %d (%v); of w1's endpoints: %v", x, len(states), states, others)
}

// managedState is the node's Atoll annotations, in a fixed order.
func managedState(n *corev1.Node) string {
	var b strings.Builder
	for _, k := range health.ManagedAnnotations {
		short := strings.TrimPrefix(k, "atoll.io/")
		if k == wellknown.AnnotationVerdict {
			short = "verdict"
		}
		fmt.Fprintf(&b, "%s=%s;", short, n.Annotations[k])
	}
	return b.String()
}
