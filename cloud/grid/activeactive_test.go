package grid_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/grid"
	atollmanager "github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestGridsTwoReplicas: two atoll-cloud replicas run the grid controllers
// on one Lease. The one not leading writes nothing; when the leader
// stops, the other takes over, leaves the children it finds right
// untouched and makes the next unit's copy.
func TestGridsTwoReplicas(t *testing.T) {
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	log := natstest.Logger(t, slog.LevelWarn)
	ctx := t.Context()
	start := func() running {
		t.Helper()
		mcfg := atollmanager.DefaultConfig()
		mcfg.LeaderElectionNamespace = "kube-system"
		mcfg.LeaseDuration, mcfg.RenewDeadline, mcfg.RetryPeriod = 4*time.Second, 2*time.Second, 200*time.Millisecond
		m, err := atollmanager.New(mcfg, cluster.RESTConfig(), log)
		if err != nil {
			t.Fatal(err)
		}
		cfg := grid.DefaultConfig()
		cfg.Resync = 0
		reg := prometheus.NewRegistry()
		if _, err := grid.New(cfg, m, log, reg); err != nil {
			t.Fatal(err)
		}
		startCtx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := m.Start(startCtx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		return running{m: m, reg: reg}
	}
	elected := func(r running) bool {
		select {
		case <-r.m.Elected():
			return true
		default:
			return false
		}
	}
	first := start()
	poll.Eventually(t, 30*time.Second, func() error {
		if !elected(first) {
			return fmt.Errorf("the first replica does not lead yet")
		}
		return nil
	})
	second := start()
	c, err := client.New(cluster.RESTConfig(), client.Options{Scheme: first.m.GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "b"} {
		if err := c.Create(ctx, node(n+"-1", map[string]string{wellknown.LabelUnit: n})); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Create(ctx, webGrid("default")); err != nil {
		t.Fatal(err)
	}
	versions := func(names ...string) (map[string]string, error) {
		out := map[string]string{}
		for _, n := range names {
			var d appsv1.Deployment
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: n}, &d); err != nil {
				return nil, err
			}
			out[n] = d.ResourceVersion
		}
		return out, nil
	}
	var before map[string]string
	poll.Eventually(t, 30*time.Second, func() error {
		var err error
		before, err = versions("web-a", "web-b")
		return err
	})
	if elected(second) {
		t.Fatal("both replicas lead")
	}
	if w := second.writes(t); w != 0 {
		t.Errorf("the replica not leading wrote %v times", w)
	}
	if w := first.writes(t); w == 0 {
		t.Error("the leader wrote nothing")
	}

	// The leader stops (releasing its Lease); the other takes over.
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := first.m.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if !elected(second) {
			return fmt.Errorf("the second replica does not lead yet")
		}
		return nil
	})
	if err := c.Create(ctx, node("c-1", map[string]string{wellknown.LabelUnit: "c"})); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		_, err := versions("web-c")
		return err
	})
	after, err := versions("web-a", "web-b")
	if err != nil {
		t.Fatal(err)
	}
	for n, v := range before {
		if after[n] != v {
			t.Errorf("%s written after the takeover (resource version %s, was %s)", n, after[n], v)
		}
	}
}
