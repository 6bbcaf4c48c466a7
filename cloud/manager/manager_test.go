package manager_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/cloud/kube"
	atollmanager "github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// TestLeaderElection: of two managers on one Lease only one runs the
// leaders' work (OnTerm); when it stops it releases the Lease and the
// other takes over. Both are ready (cache synced) all along.
func TestLeaderElection(t *testing.T) {
	cluster := kubetest.Start(t)
	cfg := atollmanager.DefaultConfig()
	cfg.LeaderElectionNamespace = "kube-system"
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 2*time.Second, 200*time.Millisecond
	log := natstest.Logger(t, slog.LevelWarn)

	start := func(name string, leading *atomic.Bool) *atollmanager.Manager {
		cfg := cfg
		cfg.Identity = name
		m, err := atollmanager.New(cfg, cluster.RESTConfig(), log.With("replica", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Ready(t.Context()); err == nil {
			t.Fatalf("%s ready before start", name)
		}
		m.OnTerm(func(ctx context.Context) {
			leading.Store(true)
			<-ctx.Done()
			leading.Store(false)
		})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		if err := m.Ready(ctx); err != nil {
			t.Fatalf("%s not ready after start: %v", name, err)
		}
		return m
	}
	var a, b atomic.Bool
	ma := start("a", &a)
	poll.Eventually(t, 20*time.Second, func() error {
		if !a.Load() {
			return errors.New("a does not lead")
		}
		return nil
	})
	start("b", &b)
	// b must not lead while a holds the Lease (many retry periods).
	deadline := time.Now().Add(2 * time.Second)
	poll.Eventually(t, 10*time.Second, func() error {
		if b.Load() {
			t.Fatal("b leads while a holds the Lease")
		}
		if time.Now().Before(deadline) {
			return errors.New("watching b")
		}
		return nil
	})
	stopCtx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := ma.Stop(stopCtx); err != nil {
		t.Fatal(err)
	}
	if err := ma.Ready(stopCtx); err == nil {
		t.Error("a ready after stop")
	}
	// a released the Lease as it stopped: b need not wait for it to
	// expire.
	lease, err := cluster.Client().CoordinationV1().Leases(cfg.LeaderElectionNamespace).Get(stopCtx, cfg.LeaderElectionID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := lease.Spec.HolderIdentity; h != nil && *h == "a" {
		t.Errorf("a stopped and still holds the Lease (renewed %v)", lease.Spec.RenewTime)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		if !b.Load() {
			return errors.New("b did not take over")
		}
		return nil
	})
}

// TestLeaseLoss: an apiserver that hangs (SIGSTOP) past the renew
// deadline ends the leader's term, not its manager: the term's context
// ends before the Lease expires (when another replica that reaches the
// apiserver may lead), the manager keeps running (cache, readiness), and
// once the apiserver answers again the replica campaigns and leads a new
// term.
func TestLeaseLoss(t *testing.T) {
	cluster := kubetest.Start(t)
	cfg := atollmanager.DefaultConfig()
	cfg.LeaderElectionNamespace = "kube-system"
	// A renew deadline close to the Lease's duration, as in production
	// (10 s of 15 s): the term must end within it.
	cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*time.Second, 3*time.Second, 200*time.Millisecond
	m, err := atollmanager.New(cfg, cluster.RESTConfig(), natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	var leading atomic.Bool
	ended := make(chan struct{}, 10)
	m.OnTerm(func(ctx context.Context) {
		leading.Store(true)
		<-ctx.Done()
		leading.Store(false)
		ended <- struct{}{}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	poll.Eventually(t, 20*time.Second, func() error {
		if !m.Leading() || !leading.Load() {
			return errors.New("does not lead")
		}
		return nil
	})
	resume, err := cluster.PauseAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resume() }()
	paused := time.Now()
	select {
	case <-ended:
		// The last renewal was before the pause: the Lease expires
		// LeaseDuration after it at the latest.
		if d := time.Since(paused); d >= cfg.LeaseDuration {
			t.Errorf("the term ended %s after the apiserver hung: past the Lease's expiry (%s), another replica may lead meanwhile", d, cfg.LeaseDuration)
		}
	case <-time.After(3 * cfg.LeaseDuration):
		t.Fatal("the term did not end while the apiserver hung")
	}
	if m.Leading() {
		t.Error("leads after its term ended")
	}
	if err := m.Err(); err != nil {
		t.Fatalf("the manager stopped with its term: %v", err)
	}
	if err := resume(); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if err := m.Err(); err != nil {
			t.Fatalf("the manager stopped: %v", err)
		}
		if m.Terms() < 2 || !leading.Load() {
			return fmt.Errorf("terms %d, leading %v", m.Terms(), leading.Load())
		}
		return nil
	})
	if err := m.Ready(t.Context()); err != nil {
		t.Errorf("not ready after a new term: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		edit func(*atollmanager.Config)
		want string
	}{
		{"default", func(*atollmanager.Config) {}, ""},
		{"no namespace", func(c *atollmanager.Config) { c.LeaderElectionNamespace = "" }, "namespace"},
		{"no id", func(c *atollmanager.Config) { c.LeaderElectionID = "" }, "id"},
		{"renew too long", func(c *atollmanager.Config) { c.RenewDeadline = c.LeaseDuration }, "renew deadline"},
		{"no namespace without election", func(c *atollmanager.Config) { c.LeaderElect, c.LeaderElectionNamespace = false, "" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := atollmanager.DefaultConfig()
			tt.edit(&c)
			err := c.Validate()
			if (err == nil) != (tt.want == "") || (err != nil && !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestModule: the app's readiness names the manager's cache, and
// controller-runtime's metrics are on the admin /metrics.
func TestModule(t *testing.T) {
	cluster := kubetest.Start(t)
	cfg := atollmanager.DefaultConfig()
	cfg.LeaderElectionNamespace = "kube-system"
	var adm *admin.Server
	var m *atollmanager.Manager
	app := fxtest.New(t,
		fx.Supply(admin.Config{Addr: "127.0.0.1:0"}, kube.Config{REST: cluster.RESTConfig(), QPS: 50, Burst: 100}, cfg,
			natstest.Logger(t, slog.LevelWarn)),
		admin.Module, kube.Module, atollmanager.Module,
		fx.Populate(&adm, &m),
	)
	// A cached read registers an informer before the start, as the
	// health service does.
	if _, err := m.GetCache().GetInformer(t.Context(), &corev1.Node{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Ready(t.Context()); err == nil {
		t.Fatal("ready before start")
	}
	app.RequireStart()
	if got := get(t, "http://"+adm.Addr()+"/readyz"); !strings.Contains(got, "[+] kube-cache ok") {
		t.Errorf("/readyz:\n%s", got)
	}
	poll.Eventually(t, 20*time.Second, func() error {
		got := get(t, "http://"+adm.Addr()+"/metrics")
		for _, want := range []string{"leader_election_master_status", "atoll_manager_leading 1", "atoll_manager_leases_lost_total 0"} {
			if !strings.Contains(got, want) {
				return fmt.Errorf("/metrics lacks %s", want)
			}
		}
		return nil
	})
	app.RequireStop()
	if err := m.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("Ready after stop = %v", err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // test helper
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && !strings.HasSuffix(url, "/readyz") {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

// TestLeaderSilent: the leader is silent when its Lease has no holder or
// has not been renewed for two retry periods; a Lease renewed within
// them is a live leader.
func TestLeaderSilent(t *testing.T) {
	cluster := kubetest.Start(t)
	cfg := atollmanager.DefaultConfig()
	cfg.LeaderElectionNamespace = "kube-system"
	m, err := atollmanager.New(cfg, cluster.RESTConfig(), natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	leases := cluster.Client().CoordinationV1().Leases(cfg.LeaderElectionNamespace)
	if _, err := m.LeaderSilent(ctx); err == nil {
		t.Error("no Lease yet, and no error")
	}
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: cfg.LeaderElectionID}}
	if lease, err = leases.Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		what    string
		holder  string
		renewed time.Duration // ago
		silent  bool
	}{
		{"no holder", "", 0, true},
		{"renewed now", "replica-0", 0, false},
		{"renewed one retry period ago", "replica-0", cfg.RetryPeriod, false},
		{"unrenewed for three retry periods", "replica-0", 3 * cfg.RetryPeriod, true},
	} {
		lease.Spec.HolderIdentity = &c.holder
		lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now().Add(-c.renewed)}
		if lease, err = leases.Update(ctx, lease, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if silent, err := m.LeaderSilent(ctx); err != nil || silent != c.silent {
			t.Errorf("%s: silent %v (%v), want %v", c.what, silent, err, c.silent)
		}
	}
}
