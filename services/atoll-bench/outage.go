package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/edge/reporter"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/edgesim"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
)

// outageOptions drive the mass outage (--scale-outage).
type outageOptions struct {
	// units are cut whole; scatter other units lose one node each, every
	// deadEvery-th of which is really dead (its peers vote it unhealthy).
	units, scatter, deadEvery int
	// toleration is the pods' unreachable/not-ready toleration.
	toleration time.Duration
	// killAfter is when, after the cut, one hub server is killed.
	killAfter time.Duration
	// settle and quiet: after the heal, at most settle until Atoll's
	// writes stop, then the window in which they must be zero.
	settle, quiet time.Duration
	// zones labels each unit's nodes with a zone of their own
	// (topology.kubernetes.io/zone), so KCM's zones are the units;
	// false: the whole fleet is one zone.
	zones bool
	// evictionRate is KCM's --node-eviction-rate: lost nodes tainted per
	// second in each zone (a zone's queue also holds the protected nodes
	// KCM taints again after the webhook dropped their taint).
	evictionRate float64
}

const outageNamespace = "outage"

// outageRow is one size's mass outage.
type outageRow struct {
	nodes, cut, whole, scattered, dead int
	noExecute, notReady                int // on peer-healthy or held nodes
	wrongEvictions                     int // peer-healthy or held pods evicted
	held, holdAnnotated                int
	deadEvicted                        int
	deadSlowest                        time.Duration // NoExecute taint → pod evicted, slowest dead node
	writes, objects, maxPerObject      int
	lagPending                         uint64
	lagOldest                          time.Duration
	lagAt                              time.Duration // when the oldest was seen, from the cut
	// The heal: Atoll's writes until they stopped (30 s without one),
	// the objects written and the most writes to one, when the last was
	// made after the heal, then the writes of the quiet window (want 0).
	healWrites, healObjects, healMaxPerObject int
	healSettled                               time.Duration
	quietWrites                               int
	killed                                    string
	details                                   []string
}

// runOutage cuts, at each size, o.units whole units and one node in each
// of o.scatter other units from the cloud at once (their simulated
// kubelets stop renewing their Leases, their emulated agents go silent),
// some of the scattered ones really dead (their peers vote them
// unhealthy), kills one of the three hub servers during the outage,
// observes until the dead nodes' toleration has passed, then heals
// everything and counts Atoll's writes once it settled. The hub is a
// three-server cluster in this process (R3 streams); atoll-cloud runs in
// its own process and dials it, with its webhook registered.
func runOutage(ctx context.Context, out io.Writer, so scaleOptions, o outageOptions) error {
	dir, bin, done, err := workDir(ctx, out, "atoll-outage-")
	if err != nil {
		return err
	}
	defer done()
	var rows []outageRow
	for i, n := range so.sizes {
		// A directory per run, not per size: a size given twice starts
		// from an empty cluster, hub and audit log again.
		fmt.Fprintf(out, "mass outage at %d nodes ...\n", n)
		r, err := measureOutage(ctx, out, filepath.Join(dir, fmt.Sprintf("%d-%d", i, n)), bin, n, so, o)
		if err != nil {
			return fmt.Errorf("%d nodes: %w", n, err)
		}
		rows = append(rows, r)
	}
	zones := "one KCM zone per unit"
	if !o.zones {
		zones = "one KCM zone for the fleet"
	}
	fmt.Fprintf(out, "\nunits of %d, %s, KCM --node-eviction-rate %g; Lease renewal every %v; grace period %v; toleration %v; hub server killed %v after the cut; after the heal, writes waited for (at most %v) until none for 30 s, then counted for %v\n",
		so.unit, zones, o.evictionRate, so.renew, so.grace, o.toleration, o.killAfter, o.settle, o.quiet)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nnodes\tcut (whole/scattered/dead)\tNoExecute seen\tnot-ready endpoints\tprotected evicted\theld (hold annotated)\tdead evicted\tslowest dead eviction\tatoll writes (objects, max per object)\tmax ballot lag\theal writes (objects, max per object), last after\twrites in the quiet window")
	for _, r := range rows {
		fmt.Fprintf(w, "%d\t%d (%d/%d/%d)\t%d\t%d\t%d\t%d (%d)\t%d/%d\t%v\t%d (%d, %d)\t%d, %v\t%d (%d, %d), %v\t%d\n", r.nodes, r.cut, r.whole, r.scattered, r.dead,
			r.noExecute, r.notReady, r.wrongEvictions, r.held, r.holdAnnotated, r.deadEvicted, r.dead, r.deadSlowest.Round(100*time.Millisecond),
			r.writes, r.objects, r.maxPerObject, r.lagPending, r.lagOldest.Round(time.Millisecond),
			r.healWrites, r.healObjects, r.healMaxPerObject, r.healSettled.Round(time.Second), r.quietWrites)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		for _, d := range r.details {
			fmt.Fprintf(out, "%d nodes: %s\n", r.nodes, d)
		}
	}
	return nil
}

// fleet is the emulated agents' shared state: which nodes are cut (their
// agent is silent) and which are dead (their peers vote them unhealthy).
type fleet struct {
	mu     sync.Mutex
	cut    map[string]bool
	dead   map[string]time.Time // since when
	kick   map[string]chan struct{}
	unitOf map[string]string
	units  map[string][]string
}

func (f *fleet) state(node string) (cut bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[node]
}

func (f *fleet) verdict(node string) (atollv1.Verdict, time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	since, dead := f.dead[node]
	if dead {
		return atollv1.Verdict_VERDICT_UNHEALTHY, since, true
	}
	return atollv1.Verdict_VERDICT_HEALTHY, time.Time{}, false
}

// kickUnit has every member of node's unit send its ballot now.
func (f *fleet) kickUnit(node string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.units[f.unitOf[node]] {
		select {
		case f.kick[m] <- struct{}{}:
		default:
		}
	}
}

// emulateVoter is emulateAgent with the fleet's state: a cut agent sends
// nothing; a ballot goes out at once when kicked (a verdict changed).
func emulateVoter(ctx context.Context, f *fleet, nc *nats.Conn, js jetstream.JetStream, node string) {
	rc, vc := reporter.DefaultConfig(), voter.DefaultConfig()
	f.mu.Lock()
	unit, members, kick := f.unitOf[node], f.units[f.unitOf[node]], f.kick[node]
	f.mu.Unlock()
	tsubj, _ := events.TopologySubject(node)
	bsubj, _ := events.BallotSubject(unit, node)
	start := timestamppb.Now()
	tt, bt := time.NewTimer(rand.N(rc.Period)), time.NewTimer(rand.N(vc.KeepAlive))
	defer tt.Stop()
	defer bt.Stop()
	for {
		keepalive := true
		select {
		case <-ctx.Done():
			return
		case <-tt.C:
			tt.Reset(rc.Period)
			if f.state(node) {
				continue
			}
			u := &atollv1.TopologyUpdate{Node: node, Unit: unit, Version: "outage", Time: timestamppb.Now(),
				RouteUrl: "nats-route://127.0.0.1:6222", Addresses: []*atollv1.NodeAddress{{Type: "InternalIP", Address: "172.16.0.1"}}}
			_ = events.Publish(nc, tsubj, u, node+"@"+strconv.FormatInt(u.GetTime().AsTime().UnixNano(), 10))
			continue
		case <-bt.C:
		case <-kick:
			keepalive = false
		}
		bt.Reset(vc.KeepAlive)
		if f.state(node) {
			continue
		}
		now := time.Now()
		b := &atollv1.Ballot{Voter: node, Unit: unit, Time: timestamppb.New(now), Members: uint32(len(members)),
			Ttl: durationpb.New(vc.TTL), Keepalive: keepalive}
		for _, m := range members {
			if m == node {
				continue
			}
			v, since, dead := f.verdict(m)
			e := &atollv1.Vote{Node: m, Verdict: v, Normal: uint32(len(members) - 2), Since: start}
			if dead {
				e.Normal, e.Abnormal, e.Since = 0, uint32(len(members)-2), timestamppb.New(since)
			}
			b.Votes = append(b.Votes, e)
		}
		pctx, cancel := context.WithTimeout(ctx, vc.AckTimeout)
		_, _ = events.PublishDurable(pctx, js, bsubj, b, node+"@"+strconv.FormatInt(now.UnixNano(), 16))
		cancel()
	}
}

// watch records what the outage does to the watched nodes and pods.
type watch struct {
	mu        sync.Mutex
	protected map[string]bool // peer-healthy cut nodes and held units' nodes
	dead      map[string]bool
	cutAt     time.Time
	noExec    map[string]time.Duration // first seen, after the cut
	notReady  map[string]time.Duration
	evicted   map[string]time.Time
	taintedAt map[string]time.Time
	unknownAt map[string]time.Time // dead nodes: Ready no longer True
}

func (w *watch) node(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoExecute
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.unknownAt[n.Name]; w.dead[n.Name] && !ok && !w.cutAt.IsZero() && !nodeReady(n) {
		w.unknownAt[n.Name] = time.Now()
	}
	if !tainted {
		return
	}
	if _, seen := w.noExec[n.Name]; w.protected[n.Name] && !seen {
		w.noExec[n.Name] = time.Since(w.cutAt)
	}
	if w.dead[n.Name] {
		if _, ok := w.taintedAt[n.Name]; !ok {
			w.taintedAt[n.Name] = time.Now()
		}
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func (w *watch) slice(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ep := range s.Endpoints {
		if ep.TargetRef == nil || ep.Conditions.Ready == nil || *ep.Conditions.Ready {
			continue
		}
		node := strings.TrimPrefix(ep.TargetRef.Name, "web-")
		if _, seen := w.notReady[node]; w.protected[node] && !seen {
			w.notReady[node] = time.Since(w.cutAt)
		}
	}
}

func (w *watch) pod(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || (p.DeletionTimestamp == nil && p.ResourceVersion != "deleted") {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.evicted[p.Spec.NodeName]; !ok {
		w.evicted[p.Spec.NodeName] = time.Now()
	}
}

func measureOutage(ctx context.Context, out io.Writer, dir, bin string, n int, so scaleOptions, o outageOptions) (outageRow, error) {
	row := outageRow{nodes: n}
	nunits := (n + so.unit - 1) / so.unit
	if o.units+o.scatter > nunits {
		return row, fmt.Errorf("--outage-units %d and --outage-scatter %d need %d units; %d nodes in units of %d make %d",
			o.units, o.scatter, o.units+o.scatter, n, so.unit, nunits)
	}
	auditDir := filepath.Join(dir, "audit")
	audit, err := kubetest.Audit(auditDir)
	if err != nil {
		return row, err
	}
	tol := int(o.toleration.Seconds())
	cluster, err := kubetest.StartCluster(ctx, kubetest.Config{Dir: filepath.Join(dir, "kube"), ControllerManager: true,
		NodeMonitorGracePeriod: so.grace, NodeMonitorPeriod: 5 * time.Second, NodeEvictionRate: o.evictionRate,
		NotReadyTolerationSeconds: tol, UnreachableTolerationSeconds: tol,
		ExtraAPIServerFlags: append(audit, "--max-requests-inflight=2000", "--max-mutating-requests-inflight=1000"),
		Logger:              slog.New(slog.DiscardHandler)})
	if err != nil {
		return row, err
	}
	defer func() { _ = cluster.Stop() }()
	client := cluster.Client()

	hubs, err := natstest.StartHubCluster(ctx, filepath.Join(dir, "hub"), slog.New(slog.DiscardHandler))
	if err != nil {
		return row, err
	}
	defer hubs.Close()

	ports := make([]int, 2)
	for i := range ports {
		if ports[i], err = natstest.FreePort(); err != nil {
			return row, err
		}
	}
	adminPort, webhookPort := ports[0], ports[1]
	certDir := filepath.Join(dir, "webhook")
	if err := cluster.WriteServingCert(certDir, "127.0.0.1"); err != nil {
		return row, err
	}
	cloudLog, err := os.Create(filepath.Join(dir, "atoll-cloud.log"))
	if err != nil {
		return row, err
	}
	defer cloudLog.Close()
	cloud := exec.CommandContext(ctx, bin,
		"--kubeconfig="+cluster.KubeconfigPath(), "--leader-elect=false",
		"--hub-url="+strings.Join(hubs.ClientURLs(), ","), "--identity-dir="+hubs.IdentityDir(), "--stream-replicas=3",
		fmt.Sprintf("--admin-addr=127.0.0.1:%d", adminPort), fmt.Sprintf("--webhook-addr=127.0.0.1:%d", webhookPort),
		"--webhook-certs=dir", "--webhook-cert-dir="+certDir, "--webhook-ca-file="+cluster.CAFile(),
		"--webhook-register=true", "--webhook-service=", fmt.Sprintf("--webhook-url=https://127.0.0.1:%d/mutate", webhookPort))
	cloud.Stdout, cloud.Stderr = cloudLog, cloudLog
	cloud.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // killed with the benchmark
	if err := cloud.Start(); err != nil {
		return row, err
	}
	defer func() { _ = cloud.Process.Signal(os.Interrupt); _ = cloud.Wait() }()
	if err := waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", adminPort), 2*time.Minute); err != nil {
		return row, fmt.Errorf("atoll-cloud not ready (see %s): %w", cloudLog.Name(), err)
	}

	// The emulated agents' connection, to every hub server.
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	userJWT, err := hubs.Issuer().Service("atoll-outage", pub)
	if err != nil {
		return row, err
	}
	seed, _ := kp.Seed()
	nc, err := nats.Connect(strings.Join(hubs.ClientURLs(), ","), nats.UserJWTAndSeed(userJWT, string(seed)), nats.MaxReconnects(-1))
	if err != nil {
		return row, err
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, hubs.Domain())
	if err != nil {
		return row, err
	}

	// Nodes, one pod each behind a Service.
	sim, err := edgesim.New(cluster.RESTConfig(), edgesim.Config{RenewInterval: so.renew, StatusInterval: so.status,
		Workers: simWorkers(n), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return row, err
	}
	if err := sim.Start(ctx); err != nil {
		return row, err
	}
	defer sim.Stop()
	f := &fleet{cut: map[string]bool{}, dead: map[string]time.Time{}, kick: map[string]chan struct{}{}, unitOf: map[string]string{}, units: map[string][]string{}}
	names := make([]string, n)
	specs := make([]edgesim.NodeSpec, n)
	for i := range n {
		names[i] = fmt.Sprintf("edge-%05d", i)
		unit := fmt.Sprintf("u%04d", i/so.unit)
		labels := map[string]string{wellknown.LabelUnit: unit}
		if o.zones {
			// KCM's zones: one per unit, as a site is labelled.
			labels[corev1.LabelTopologyZone] = unit
		}
		specs[i] = edgesim.NodeSpec{Name: names[i], Labels: labels}
		f.unitOf[names[i]] = unit
		f.units[unit] = append(f.units[unit], names[i])
		f.kick[names[i]] = make(chan struct{}, 1)
	}
	so.progress.begin(fmt.Sprintf("outage %d: registering nodes", n))
	if err := addNodes(ctx, sim, specs, func(done int) { so.progress.count(done, n, "registered") }); err != nil {
		return row, err
	}
	so.progress.end()
	if err := cluster.CreateNamespace(ctx, outageNamespace); err != nil {
		return row, err
	}
	if err := createPods(ctx, client, names); err != nil {
		return row, err
	}
	actx, stopAgents := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stopAgents(); wg.Wait() }()
	for _, name := range names {
		wg.Go(func() { emulateVoter(actx, f, nc, js, name) })
	}
	fmt.Fprintln(out, "  waiting until every node is peer-healthy and every endpoint ready ...")
	so.progress.begin(fmt.Sprintf("outage %d: waiting until every node is peer-healthy", n))
	// Every node's first verdict annotation is an informational write, at
	// the informational client's 20/s: 10,000 nodes take over 8 min. The
	// steady-state run's bound on the joining writes bounds this too.
	if err := waitFormed(ctx, client, n, max(5*time.Minute, so.settle), so.progress); err != nil {
		return row, err
	}

	// Who is cut: whole units first, then one node in each of the next
	// scatter units, every deadEvery-th of those really dead.
	w := &watch{protected: map[string]bool{}, dead: map[string]bool{}, noExec: map[string]time.Duration{}, notReady: map[string]time.Duration{}, evicted: map[string]time.Time{}, taintedAt: map[string]time.Time{}, unknownAt: map[string]time.Time{}}
	var cut, held []string
	for u := range o.units {
		members := f.units[fmt.Sprintf("u%04d", u)]
		cut, held = append(cut, members...), append(held, members...)
		for _, m := range members {
			w.protected[m] = true
		}
	}
	for s := range o.scatter {
		m := f.units[fmt.Sprintf("u%04d", o.units+s)][0]
		cut = append(cut, m)
		if o.deadEvery > 0 && s%o.deadEvery == 0 {
			w.dead[m] = true
		} else {
			w.protected[m] = true
		}
	}
	row.cut, row.whole, row.scattered, row.dead, row.held = len(cut), len(held), o.scatter, len(w.dead), len(held)

	inf := informers.NewSharedInformerFactory(client, 0)
	handler := func(fn func(any)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: fn, UpdateFunc: func(_, o any) { fn(o) }, DeleteFunc: fn}
	}
	if _, err := inf.Core().V1().Nodes().Informer().AddEventHandler(handler(w.node)); err != nil {
		return row, err
	}
	nsInf := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(outageNamespace))
	if _, err := nsInf.Discovery().V1().EndpointSlices().Informer().AddEventHandler(handler(w.slice)); err != nil {
		return row, err
	}
	if _, err := nsInf.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, o any) { w.pod(o) },
		DeleteFunc: func(o any) {
			if p, ok := o.(*corev1.Pod); ok {
				p = p.DeepCopy()
				p.ResourceVersion = "deleted"
				o = p
			}
			w.pod(o)
		},
	}); err != nil {
		return row, err
	}
	ictx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	inf.Start(ictx.Done())
	nsInf.Start(ictx.Done())
	inf.WaitForCacheSync(ictx.Done())
	nsInf.WaitForCacheSync(ictx.Done())

	writes0, err := atollWritesByObject(auditDir)
	if err != nil {
		return row, err
	}
	kcm0, err := nodeControllerWrites(auditDir)
	if err != nil {
		return row, err
	}
	// The hub's report of a cut leaf, as atoll-cloud records it (the
	// emulated agents have no leafs of their own: see FollowLinks).
	links, err := js.KeyValue(ctx, health.LinksBucket)
	if err != nil {
		return row, fmt.Errorf("links bucket: %w", err)
	}
	// The cut, all at once.
	fmt.Fprintf(out, "  cutting %d nodes (%d in %d whole units, %d scattered, %d of them dead) ...\n", len(cut), len(held), o.units, o.scatter, len(w.dead))
	cutAt := time.Now()
	w.mu.Lock()
	w.cutAt = cutAt
	w.mu.Unlock()
	f.mu.Lock()
	for _, m := range cut {
		f.cut[m] = true
	}
	for m := range w.dead {
		f.dead[m] = cutAt
	}
	f.mu.Unlock()
	for _, m := range cut {
		if err := sim.Partition(m); err != nil {
			return row, err
		}
	}
	for m := range w.dead {
		f.kickUnit(m)
	}
	for _, m := range cut {
		if _, err := links.Put(ctx, m, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			return row, fmt.Errorf("record %s's link loss: %w", m, err)
		}
	}
	// The watch lasts until the toleration + 45 s after the grace period,
	// and on, up to 3 min more, while a dead node's pod is still there
	// (KCM at 10,000 Nodes notices lost nodes late: each dead node's
	// times are printed).
	end := cutAt.Add(so.grace + o.toleration + 15*time.Second + 30*time.Second)
	hardEnd := end.Add(3 * time.Minute)
	deadLeft := func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for m := range w.dead {
			if _, ok := w.evicted[m]; !ok {
				return true
			}
		}
		return false
	}
	killed := false
	tick := time.NewTicker(time.Second)
	so.progress.begin(fmt.Sprintf("outage %d: watching the cut", n))
	for now := time.Now(); now.Before(end) || (now.Before(hardEnd) && deadLeft()); now = time.Now() {
		so.progress.timed(max(end.Sub(cutAt), now.Add(time.Second).Sub(cutAt)))
		if !killed && now.Sub(cutAt) >= o.killAfter {
			row.killed = hubs.Server(0).Name()
			if err := hubs.Kill(0); err != nil {
				return row, err
			}
			killed = true
			fmt.Fprintf(out, "  killed hub server %s %v after the cut\n", row.killed, time.Since(cutAt).Round(100*time.Millisecond))
		}
		if p, age := consumerLag(ctx, js, events.BallotConsumer.Name); p > row.lagPending || age > row.lagOldest {
			if age > row.lagOldest {
				row.lagAt = now.Sub(cutAt)
			}
			row.lagPending, row.lagOldest = max(p, row.lagPending), max(age, row.lagOldest)
		}
		select {
		case <-ctx.Done():
			tick.Stop()
			return row, ctx.Err()
		case <-tick.C:
		}
	}
	tick.Stop()
	so.progress.end()
	writes1, err := atollWritesByObject(auditDir)
	if err != nil {
		return row, err
	}
	for _, k := range slices.Sorted(maps.Keys(writes1)) {
		if d := writes1[k] - writes0[k]; d > 0 {
			row.writes += d
			row.objects++
			row.maxPerObject = max(row.maxPerObject, d)
			if d > 1 {
				row.details = append(row.details, fmt.Sprintf("%d atoll writes to %s", d, k))
			}
		}
	}
	row.details = append(row.details, fmt.Sprintf("watched %v after the cut; oldest unhandled ballot (%v) seen %v after the cut",
		time.Since(cutAt).Round(time.Second), row.lagOldest.Round(time.Millisecond), row.lagAt.Round(time.Second)))
	w.mu.Lock()
	row.noExecute, row.notReady = len(w.noExec), len(w.notReady)
	for _, m := range slices.Sorted(maps.Keys(w.noExec)) {
		row.details = append(row.details, fmt.Sprintf("NoExecute on %s %v after the cut", m, w.noExec[m].Round(100*time.Millisecond)))
	}
	for _, m := range slices.Sorted(maps.Keys(w.notReady)) {
		row.details = append(row.details, fmt.Sprintf("endpoint of web-%s not ready %v after the cut", m, w.notReady[m].Round(100*time.Millisecond)))
	}
	for m := range w.protected {
		if _, ok := w.evicted[m]; ok {
			row.wrongEvictions++
		}
	}
	// Each dead node's way to its eviction, from the cut: when the node
	// lifecycle controller saw it lost, tainted it, and when its pod went.
	since := func(m map[string]time.Time, node string) string {
		if t, ok := m[node]; ok {
			return "+" + t.Sub(cutAt).Round(100*time.Millisecond).String()
		}
		return "never"
	}
	for _, m := range slices.Sorted(maps.Keys(w.dead)) {
		row.details = append(row.details, fmt.Sprintf("dead node %s: Ready lost %s, NoExecute %s, pod evicted %s (from the cut)",
			m, since(w.unknownAt, m), since(w.taintedAt, m), since(w.evicted, m)))
		at, ok := w.evicted[m]
		if !ok {
			continue
		}
		row.deadEvicted++
		if t, ok := w.taintedAt[m]; ok {
			row.deadSlowest = max(row.deadSlowest, at.Sub(t))
		}
	}
	w.mu.Unlock()
	// What the node lifecycle controller wrote meanwhile: re-taints of
	// protected nodes (each dropped by the webhook) share its client and
	// its tainting queue with the dead nodes' taints.
	kcm1, err := nodeControllerWrites(auditDir)
	if err != nil {
		return row, err
	}
	byClass := map[string]int{}
	for k, v := range kcm1 {
		if d := v - kcm0[k]; d > 0 {
			what, node, _ := strings.Cut(k, " ")
			class := "other"
			switch {
			case w.dead[node]:
				class = "dead"
			case w.protected[node]:
				class = "protected"
			}
			byClass[what+" of "+class+" nodes"] += d
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byClass)) {
		row.details = append(row.details, fmt.Sprintf("node-controller during the watch: %d %s", byClass[k], k))
	}
	for _, m := range held {
		node, err := client.CoreV1().Nodes().Get(ctx, m, metav1.GetOptions{})
		if err == nil && node.Annotations[wellknown.AnnotationHoldUntil] != "" {
			row.holdAnnotated++
		}
	}

	// Heal: the hub server returns, every node comes back.
	fmt.Fprintln(out, "  healing ...")
	hb, err := atollWritesByObject(auditDir)
	if err != nil {
		return row, err
	}
	healAt := time.Now()
	if err := hubs.Restart(ctx, 0); err != nil {
		return row, err
	}
	f.mu.Lock()
	clear(f.cut)
	clear(f.dead)
	f.mu.Unlock()
	for _, m := range cut {
		if err := sim.Heal(m); err != nil {
			return row, err
		}
		f.kickUnit(m)
	}
	// The heal's writes (verdicts back, holds ended: informational, at
	// that client's rate) until they stop; then the quiet window.
	so.progress.begin(fmt.Sprintf("outage %d: waiting until the heal's writes stop", n))
	_, lastWrite, err := settleWrites(ctx, auditDir, o.settle, "--outage-settle")
	so.progress.end()
	switch {
	case ctx.Err() != nil:
		return row, ctx.Err()
	case err != nil:
		row.details = append(row.details, err.Error())
	}
	h0, err := atollWritesByObject(auditDir)
	if err != nil {
		return row, err
	}
	row.healSettled = lastWrite.Sub(healAt)
	for k, v := range h0 {
		if d := v - hb[k]; d > 0 {
			row.healWrites += d
			row.healObjects++
			row.healMaxPerObject = max(row.healMaxPerObject, d)
		}
	}
	if err := so.progress.wait(ctx, fmt.Sprintf("outage %d: counting writes", n), o.quiet); err != nil {
		return row, err
	}
	h1, err := atollWritesByObject(auditDir)
	if err != nil {
		return row, err
	}
	row.quietWrites = sum(h1) - sum(h0)
	// The heal's writes: by resource, and the objects written most.
	byResource, perObject := map[string]int{}, map[string]int{}
	for k, v := range h1 {
		if d := v - hb[k]; d > 0 {
			resource, _, _ := strings.Cut(k, "/")
			byResource[resource] += d
			perObject[k] = d
		}
	}
	for _, r := range slices.Sorted(maps.Keys(byResource)) {
		row.details = append(row.details, fmt.Sprintf("writes from the heal on: %d to %s", byResource[r], r))
	}
	top := slices.SortedFunc(maps.Keys(perObject), func(a, b string) int {
		return cmp.Or(cmp.Compare(perObject[b], perObject[a]), cmp.Compare(a, b))
	})
	for _, k := range top[:min(5, len(top))] {
		row.details = append(row.details, fmt.Sprintf("writes from the heal on: %d to %s", perObject[k], k))
	}
	return row, nil
}

// createPods creates one pod per node (web-<node>, bound to it) and the
// Service selecting them.
func createPods(ctx context.Context, client kubernetes.Interface, nodes []string) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: outageNamespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(80)}}}}
	if _, err := client.CoreV1().Services(outageNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service web: %w", err)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range 16 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(nodes); i = int(next.Add(1)) - 1 {
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-" + nodes[i], Namespace: outageNamespace, Labels: map[string]string{"app": "web"}},
					Spec: corev1.PodSpec{NodeName: nodes[i], Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10",
						Ports: []corev1.ContainerPort{{ContainerPort: 80}}}}}}
				if _, err := client.CoreV1().Pods(outageNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("pod %s: %w", p.Name, err))
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// waitFormed waits until every one of n nodes carries the healthy verdict
// and every pod's endpoint is ready.
func waitFormed(ctx context.Context, client kubernetes.Interface, n int, within time.Duration, p *progress) error {
	deadline := time.Now().Add(within)
	for {
		healthy, ready := 0, 0
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, node := range nodes.Items {
				if node.Annotations[wellknown.AnnotationVerdict] == wellknown.VerdictHealthy {
					healthy++
				}
			}
		}
		slices, err := client.DiscoveryV1().EndpointSlices(outageNamespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, s := range slices.Items {
				for _, ep := range s.Endpoints {
					if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
						ready++
					}
				}
			}
		}
		if healthy == n && ready == n {
			p.end()
			return nil
		}
		p.count(healthy, n, fmt.Sprintf("nodes peer-healthy, %d endpoints ready", ready))
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %d of %d nodes peer-healthy, %d endpoints ready", within, healthy, n, ready)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// atollWritesByObject counts atoll-cloud's writes in the audit log so
// far, by object (resource, namespace, name).
func atollWritesByObject(auditDir string) (map[string]int, error) {
	return auditWrites(auditDir, func(e kubetest.AuditEvent) string {
		if !strings.HasPrefix(e.UserAgent, wellknown.FieldManager) {
			return ""
		}
		return e.Object() // subresources count for their object
	})
}

// nodeControllerUser is the node lifecycle controller's identity
// (kube-controller-manager runs each controller under its own
// ServiceAccount in the harness).
const nodeControllerUser = "system:serviceaccount:kube-system:node-controller"

// nodeControllerWrites counts the node lifecycle controller's writes to
// Nodes so far, by "taints <node>" (its patches of the Node: taints) and
// "status <node>" (its condition updates, which the harness's audit
// policy leaves out today).
func nodeControllerWrites(auditDir string) (map[string]int, error) {
	return auditWrites(auditDir, func(e kubetest.AuditEvent) string {
		if e.User.Username != nodeControllerUser || e.ObjectRef.Resource != "nodes" {
			return ""
		}
		if e.ObjectRef.Subresource == "status" {
			return "status " + e.ObjectRef.Name
		}
		return "taints " + e.ObjectRef.Name
	})
}

// auditWrites counts the writes (create, update, patch, delete) of the
// audit log so far by key(event); events with an empty key are left out.
func auditWrites(auditDir string, key func(kubetest.AuditEvent) string) (map[string]int, error) {
	out := map[string]int{}
	evs, err := kubetest.ReadAudit(kubetest.AuditLog(auditDir))
	if err != nil {
		if os.IsNotExist(err) {
			return out, nil
		}
		return nil, err
	}
	for _, e := range evs {
		switch e.Verb {
		case "create", "update", "patch", "delete":
			if k := key(e); k != "" {
				out[k]++
			}
		}
	}
	return out, nil
}
