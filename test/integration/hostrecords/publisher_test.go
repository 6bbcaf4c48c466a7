package hostrecords_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/views/hostrecords"
	"github.com/atoll-edge/atoll/edge/hosts"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/crds"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

type staticUnit string

func (u staticUnit) Unit() string           { return string(u) }
func (staticUnit) Changes() <-chan struct{} { return nil }

// installCRDs applies deploy/crds to the cluster.
func installCRDs(t *testing.T, cluster *kubetest.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, cluster); err != nil {
		t.Fatal(err)
	}
}

// TestHostRecordsReachTheEdges: a real apiserver with a StatefulSetGrid
// over two units and its pods, the publisher on a real hub, and an edge
// hosts writer per unit: each unit's file maps the grid's names to its
// own unit's pod IPs; a pod IP change rewrites only that unit's file and
// publishes nothing for the other; a resync publishes nothing; deleting
// the grid empties both files.
func TestHostRecordsReachTheEdges(t *testing.T) {
	cluster := kubetest.Start(t)
	installCRDs(t, cluster)
	h := natstest.Hub(t)
	log := natstest.Logger(t, slog.LevelWarn)
	ctx := t.Context()
	kc := cluster.Client()

	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	views, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}

	// No controller manager here: the pods' service account by hand.
	if _, err := kc.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ name, unit string }{{"n1", "u1"}, {"n2", "u2"}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{wellknown.LabelUnit: n.unit}}}
		if _, err := kc.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Two replicas, active-active, each on its own manager and connection.
	var (
		pubs []*hostrecords.Publisher
		regs []*prometheus.Registry
	)
	for i := range 2 {
		rnc, err := h.Connect(fmt.Sprint("cloud-", i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rnc.Close)
		rjs, err := jetstream.NewWithDomain(rnc, h.Domain())
		if err != nil {
			t.Fatal(err)
		}
		mcfg := manager.DefaultConfig()
		mcfg.LeaderElect = false
		m, err := manager.New(mcfg, cluster.RESTConfig(), log)
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		cfg := hostrecords.DefaultConfig()
		cfg.Debounce = 0
		pub, err := hostrecords.New(cfg, m.GetClient(), hublink.Of(rnc, rjs), log.With("replica", i), reg)
		if err != nil {
			t.Fatal(err)
		}
		if err := pub.SetupWithManager(m); err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		if err := m.Start(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		t.Cleanup(func() { _ = m.Stop(context.Background()) })
		runCtx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = pub.Run(runCtx) }()
		t.Cleanup(func() { stop(); <-done })
		pubs, regs = append(pubs, pub), append(regs, reg)
	}
	c := newClient(t, cluster)

	// One edge node per unit, each with its hosts writer.
	files := map[string]string{}
	writers := map[string]*hosts.Writer{}
	for _, u := range []string{"u1", "u2"} {
		edge := natstest.Unit(t, h, u, natstest.EdgeOptions{}, "e-"+u)[0]
		enc, err := edge.Connect("hosts")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(enc.Close)
		ejs, err := jetstream.NewWithDomain(enc, h.Domain())
		if err != nil {
			t.Fatal(err)
		}
		files[u] = filepath.Join(t.TempDir(), "atoll.hosts")
		feeds, err := viewfeed.NewFeeds(viewfeed.DefaultConfig(), hublink.Of(enc, ejs), edge, log, nil)
		if err != nil {
			t.Fatal(err)
		}
		w, err := hosts.New(hosts.Config{Path: files[u], ClusterDomain: "cluster.local"}, feeds, staticUnit(u), log)
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(context.Background())
		wdone := make(chan struct{})
		go func() { defer close(wdone); _ = w.Run(wctx) }()
		t.Cleanup(func() { cancel(); <-wdone })
		writers[u] = w
	}
	holds := func(u, want string) func() error {
		return func() error {
			b, err := os.ReadFile(files[u])
			if err != nil {
				return err
			}
			if full := string(hosts.Render(&atollv1.HostRecords{Unit: u}, "")) + want; string(b) != full {
				return fmt.Errorf("%s's file holds %q, want %q", u, b, full)
			}
			return nil
		}
	}

	// The grid (the CRD may take a moment to be served).
	ssg := &appsv1alpha1.StatefulSetGrid{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default"}}
	ssg.Spec.Template = appsv1.StatefulSetSpec{
		ServiceName: "db-svc",
		Selector:    &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "db"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "db", Image: "db"}}},
		},
	}
	poll.Eventually(t, 60*time.Second, func() error { return c.Create(ctx, ssg.DeepCopy()) })

	// Its pods, as the StatefulSet controller and the kubelet would make them.
	setPod := func(unit string, i int, ip string) {
		t.Helper()
		set := "db-" + unit
		name := fmt.Sprintf("%s-%d", set, i)
		pod, err := kc.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			pod = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{
					Name: name, Namespace: "default",
					Labels: map[string]string{"app": "db", wellknown.LabelGrid: "db", wellknown.LabelGridUnit: unit},
					OwnerReferences: []metav1.OwnerReference{{
						APIVersion: "apps/v1", Kind: "StatefulSet", Name: set, UID: types.UID("0c3b7e0e-0000-4000-8000-00000000000" + fmt.Sprint(i)),
						Controller: ptr.To(true),
					}},
				},
				Spec: corev1.PodSpec{
					Hostname: name, Subdomain: "db-svc", NodeName: map[string]string{"u1": "n1", "u2": "n2"}[unit],
					Containers: []corev1.Container{{Name: "db", Image: "db"}},
				},
			}
			if pod, err = kc.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.PodIP = ip
		pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
		if _, err := kc.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setPod("u1", 0, "10.1.0.1")
	setPod("u1", 1, "10.1.0.2")
	setPod("u2", 0, "10.2.0.1")

	poll.Eventually(t, 60*time.Second, holds("u1",
		"10.1.0.1 db-0.db-svc.default.svc.cluster.local\n10.1.0.2 db-1.db-svc.default.svc.cluster.local\n"))
	poll.Eventually(t, 60*time.Second, holds("u2", "10.2.0.1 db-0.db-svc.default.svc.cluster.local\n"))

	lastSeq := func(u string) uint64 {
		t.Helper()
		subj, err := events.HostsSubject(u)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := views.GetLastMsgForSubject(ctx, subj)
		if err != nil {
			t.Fatal(err)
		}
		return raw.Sequence
	}
	streamSeq := func() uint64 {
		t.Helper()
		info, err := views.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	passesOf := func(reg *prometheus.Registry) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "atoll_hostrecords_passes_total" {
				return mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	passes := func() float64 { return passesOf(regs[0]) + passesOf(regs[1]) }
	// A resync of both replicas publishes nothing.
	u1Seq, u2Seq, all := lastSeq("u1"), lastSeq("u2"), streamSeq()
	before := passes()
	for _, p := range pubs {
		p.Resync()
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if passes() < before+2 {
			return fmt.Errorf("the replicas' resync passes are not done")
		}
		return nil
	})
	if a, b, n := lastSeq("u1"), lastSeq("u2"), streamSeq(); a != u1Seq || b != u2Seq || n != all {
		t.Fatalf("a resync republished unchanged records: u1 %d→%d, u2 %d→%d, stream %d→%d", u1Seq, a, u2Seq, b, all, n)
	}

	// A pod IP change reaches its unit only.
	u2Writes := writers["u2"].Writes()
	setPod("u1", 0, "10.1.0.9")
	poll.Eventually(t, 60*time.Second, holds("u1",
		"10.1.0.2 db-1.db-svc.default.svc.cluster.local\n10.1.0.9 db-0.db-svc.default.svc.cluster.local\n"))
	if got := lastSeq("u2"); got != u2Seq {
		t.Fatalf("u2's records republished (seq %d→%d) for a change in u1", u2Seq, got)
	}
	if got := writers["u2"].Writes(); got != u2Writes {
		t.Fatalf("u2's file rewritten %d times for a change in u1", got-u2Writes)
	}
	// Both replicas made that change; the stream stored it once.
	// waitPasses returns once each replica has made a whole pass that
	// started after it was called.
	waitPasses := func() {
		t.Helper()
		for i, p := range pubs {
			for range 2 {
				at := passesOf(regs[i])
				p.Changed()
				poll.Eventually(t, 30*time.Second, func() error {
					if passesOf(regs[i]) < at+1 {
						return fmt.Errorf("replica %d has not made its pass", i)
					}
					return nil
				})
			}
		}
	}
	waitPasses()
	if got := streamSeq(); got != all+1 {
		t.Fatalf("one pod IP change stored %d messages with two replicas, want 1", got-all)
	}
	all = streamSeq()

	// Deleting the grid empties both files (its pods may stay: no GC here).
	if err := c.Delete(ctx, ssg); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 60*time.Second, holds("u1", ""))
	poll.Eventually(t, 60*time.Second, holds("u2", ""))
	waitPasses()
	if got := streamSeq(); got != all+2 {
		t.Fatalf("deleting the grid stored %d messages with two replicas, want 2 (an empty set per unit)", got-all)
	}
}

// newClient is a controller-runtime client that knows the grid types.
func newClient(t *testing.T, cluster *kubetest.Cluster) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := appsv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(cluster.RESTConfig(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
