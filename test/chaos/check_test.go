package chaos

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/test/kubetest"
)

// testChecker is a checker of a two-unit plan fed by hand: no apiserver.
func testChecker(t *testing.T) *Checker {
	t.Helper()
	dir := t.TempDir()
	plan := Plan{Schedule: Schedule{Topology: Options{Units: 2, Nodes: 3}.Topo()}, Namespace: Workload,
		Grace: 20 * time.Second, Toleration: 30 * time.Second}
	c := newChecker(plan, dir, slog.New(slog.DiscardHandler), nil)
	var err error
	if c.vout, err = os.Create(filepath.Join(dir, ViolationsFile)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.vout.Close() })
	return c
}

// play records f in force from ago before now (still in force when
// lasted is 0).
func (c *Checker) play(f Fault, ago, lasted time.Duration) {
	begin := time.Now().Add(-ago)
	entries := []Entry{{T: begin.Add(-time.Hour), Phase: PhaseStart}, {T: begin, Phase: PhaseBegin, Fault: f}}
	if lasted > 0 {
		entries = append(entries, Entry{T: begin.Add(lasted), Phase: PhaseEnd, Fault: f})
	}
	c.truth.add(entries)
}

func tainted(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute}}}}
}

func deleting(name, node string) *corev1.Pod {
	now := metav1.Now()
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, DeletionTimestamp: &now}, Spec: corev1.PodSpec{NodeName: node}}
}

func slice(pod, node string, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "web-svc-x"}, Endpoints: []discoveryv1.Endpoint{{
		NodeName: &node, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod, UID: types.UID(pod)},
	}}}
}

// A node cut from the cloud whose peers see it: a taint held past the
// bound, an eviction and an endpoint turned not ready are each caught.
func TestCheckerCatchesAnUnprotectedNode(t *testing.T) {
	c := testChecker(t)
	c.play(Fault{ID: 1, Kind: NodeCut, Unit: "a", Node: "edge-a1"}, time.Minute, 0)
	c.onNode(tainted("edge-a1"))
	c.checkTaints(time.Now().Add(TaintBound / 2))
	if len(c.violations) != 0 {
		t.Fatalf("a taint within the bound reported: %v", c.violations)
	}
	c.checkTaints(time.Now().Add(TaintBound + time.Second))
	c.onPod(deleting("web-a-1", "edge-a1"))
	c.onSlice(slice("web-a-2", "edge-a1", true))
	c.onSlice(slice("web-a-2", "edge-a1", false))
	c.judgeTurned(time.Now().Add(podsCatchUp))
	if len(c.violations) != 3 {
		t.Fatalf("want the taint, the eviction and the endpoint, got %d: %+v", len(c.violations), c.violations)
	}
	for _, v := range c.violations {
		if v.Invariant != InvProtected || len(v.Faults) != 1 {
			t.Errorf("want invariant 1 with the cut in force: %+v", v)
		}
	}
}

// An endpoint turned not ready because the kubelet found its pod's
// containers not ready (a readiness probe failing) is the workload's own
// verdict: counted, not a violation, even when the pod's status arrives
// after the slice's.
func TestCheckerLeavesTheKubeletsVerdict(t *testing.T) {
	c := testChecker(t)
	c.play(Fault{ID: 1, Kind: Degrade, Unit: "a", Node: "edge-a1"}, time.Minute, 0)
	c.onSlice(slice("web-a-2", "edge-a1", true))
	c.onSlice(slice("web-a-2", "edge-a1", false))
	c.judgeTurned(time.Now())
	notReady := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-a-2"}, Spec: corev1.PodSpec{NodeName: "edge-a1"},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.ContainersReady, Status: corev1.ConditionFalse}, {Type: corev1.PodReady, Status: corev1.ConditionFalse}}}}
	c.onPod(notReady)
	c.judgeTurned(time.Now().Add(podsCatchUp))
	if len(c.violations) != 0 || c.bounds.ContainersNotReady != 1 {
		t.Fatalf("the kubelet's verdict: %d counted, violations %+v", c.bounds.ContainersNotReady, c.violations)
	}
}

// A dead node may be tainted and evicted; one never evicted is caught
// when it boots.
func TestCheckerLetsDeadNodesGo(t *testing.T) {
	c := testChecker(t)
	dies := Fault{ID: 1, Kind: NodeDies, Unit: "a", Node: "edge-a2"}
	c.podNode["web-a-1"] = "edge-a2"
	c.play(dies, 10*time.Second, 0)
	c.snapshot(dies)
	c.onNode(tainted("edge-a2"))
	c.checkTaints(time.Now().Add(time.Minute))
	c.onSlice(slice("web-a-1", "edge-a2", true))
	c.onSlice(slice("web-a-1", "edge-a2", false))
	c.judgeTurned(time.Now().Add(podsCatchUp))
	if len(c.violations) != 0 {
		t.Fatalf("a dead node's taint or endpoint reported: %+v", c.violations)
	}
	c.truth.add([]Entry{{T: time.Now(), Phase: PhaseEnd, Fault: dies}})
	c.checkDead()
	if len(c.violations) != 1 || c.violations[0].Invariant != InvDeadEvicted || c.violations[0].Object != "pod/web-a-1" {
		t.Fatalf("want its pod reported as never deleted: %+v", c.violations)
	}
	if d := c.bounds.DeadTaint; d < 10*time.Second || d > 11*time.Second {
		t.Errorf("the taint came %s after the power cut, want 10 s", d)
	}
}

// A client failing while its unit is cut, or answered by another unit,
// is caught; a failure while its unit is whole is counted only.
func TestCheckerJudgesClients(t *testing.T) {
	c := testChecker(t)
	c.play(Fault{ID: 1, Kind: UnitCut, Unit: "a"}, time.Minute, 0)
	counts := map[string][2]int{}
	now := time.Now()
	c.call(Call{T: now, Unit: "a", Node: "edge-a1", OK: true, Detail: "web-a-x-1"}, counts)
	c.call(Call{T: now, Unit: "a", Node: "edge-a1", Detail: "timeout"}, counts)
	c.call(Call{T: now, Unit: "b", Node: "edge-b1", Detail: "timeout"}, counts)
	c.call(Call{T: now, Unit: "b", Node: "edge-b1", OK: true, Detail: "web-a-x-2"}, counts)
	c.judgeForeign(now)
	if len(c.violations) != 2 {
		t.Fatalf("want the failure in the cut unit and the foreign answer, got %+v", c.violations)
	}
	if a, b := c.calls["a"], c.calls["b"]; a.CutOK != 1 || a.CutFailed != 1 || b.Failed != 1 || b.Foreign != 1 {
		t.Errorf("counts: a %+v, b %+v", *a, *b)
	}
	if counts["a"] != [2]int{1, 1} || counts["b"] != [2]int{1, 1} {
		t.Errorf("sample counts: %v", counts)
	}
}

// An answer from a pod of another unit that a relabel explains is no
// violation though the relabel's journal entry comes after the answer is
// read (the injector writes it once the label is set, seconds later on a
// stalling apiserver): it is judged once the journal has caught up.
func TestCheckerWaitsForTheJournalToJudgeForeignAnswers(t *testing.T) {
	c := testChecker(t)
	c.play(Fault{ID: 1, Kind: NodeCut, Unit: "c", Node: "edge-c1"}, time.Minute, 0)
	c.podNode["web-a-x-1"] = "edge-a3"
	now := time.Now()
	c.call(Call{T: now, Unit: "e", Node: "edge-e1", OK: true, Detail: "web-a-x-1"}, map[string][2]int{})
	c.judgeForeign(now.Add(-journalLag)) // the sample that read the answer
	relabel := Fault{ID: 2, Kind: Relabel, Unit: "a", Node: "edge-a3", To: "e"}
	c.truth.add([]Entry{{T: now.Add(-3 * time.Second), Phase: PhaseBegin, Fault: relabel}})
	c.judgeForeign(now.Add(journalLag))
	if len(c.violations) != 0 || c.calls["e"].Foreign != 0 {
		t.Fatalf("an answer the relabel explains was reported: %+v", c.violations)
	}
}

// Memory is judged per process, past its first ten minutes, over its
// last hour: processes that ran too briefly are not judged, the median
// of those judged decides, and a server's established connections are
// no leak.
func TestGrowthIsJudgedPerProcess(t *testing.T) {
	start := time.Now()
	moved := func(h float64) int {
		if h < 0.5 {
			return 0
		}
		return 12
	}
	var samples []Sample
	for i := range 240 { // an hour, every 15 s
		at := start.Add(time.Duration(i) * SampleEvery)
		h := at.Sub(start).Hours()
		s := Sample{T: at, Procs: []ProcUsage{
			{Comm: "atoll-edge", PID: 1, RSSMiB: 40, FDs: 20},
			{Comm: "atoll-edge", PID: 2, RSSMiB: 40 + 30*h, FDs: 20 + int(50*h)}, // leaks
			{Comm: "atoll-edge", PID: 3, RSSMiB: 41, FDs: 21},
			// a server whose peers die at half past: their leafs move to
			// it, its memory follows them
			{Comm: "nats-server", PID: 5, RSSMiB: 40 + 1.5*float64(moved(h)) + float64(i%3), FDs: 30 + moved(h), Conns: 10 + moved(h)},
		}}
		if i < 40 { // killed after 10 minutes, growing all along
			s.Procs = append(s.Procs, ProcUsage{Comm: "atoll-cloud", PID: 9, RSSMiB: 50 + 600*h, FDs: 30})
		}
		samples = append(samples, s)
	}
	last := samples[len(samples)-1].T
	edge, judged := growth(samples, "atoll-edge", last)
	if judged != 3 || edge.RSS > 0.1 || edge.FDs > 0.1 || edge.MeanRSS < 40 || edge.MeanRSS > 41 {
		t.Errorf("atoll-edge: %+v, judged %d; want the median of three (flat)", edge, judged)
	}
	if hub, judged := growth(samples, "nats-server", last); judged != 1 || math.Abs(hub.FDs) > 0.1 || math.Abs(hub.RSS) > 0.5 {
		t.Errorf("nats-server gaining connections: %+v, judged %d; want flat", hub, judged)
	}
	if cloud, judged := growth(samples, "atoll-cloud", last); judged != 0 || cloud.Judged != 0 {
		t.Errorf("atoll-cloud killed after 10 minutes judged: %+v", cloud)
	}
	samples = samples[:200]
	for i := range samples {
		samples[i].Procs = samples[i].Procs[1:2] // the leaking one alone
	}
	if leak, judged := growth(samples, "atoll-edge", samples[len(samples)-1].T); judged != 1 || leak.RSS < 29 || leak.RSS > 31 || leak.FDs < 49 {
		t.Errorf("the leaking process: %+v, judged %d; want +30 MiB/h, +50 fds/h", leak, judged)
	}
}

// The hub: acknowledged messages no server holds any more are lost; one
// server going back while another holds them is not, nor a shortfall
// seen once (a new leader applying what its log holds) or while a
// server does not answer; a hub remade with no pod of the old one starts
// again. A durable consumer with a backlog over the bound, or one that
// does not move, in a quiet period is caught; a backlog during a fault,
// or one that moves, is not.
func TestCheckerJudgesTheHub(t *testing.T) {
	c := testChecker(t)
	// A fault ended 10 minutes ago: quiet now.
	c.play(Fault{Kind: NodeCut, Node: "edge-a1", Unit: "a"}, 11*time.Minute, time.Minute)
	now := time.Now()
	at := func(i int) time.Time { return now.Add(time.Duration(i) * SampleEvery) }
	server := func(uid string, lastSeq uint64, consumers ...HubConsumer) HubServer {
		return HubServer{Pod: "atoll-hub-" + uid, UID: uid, Name: "hub-" + uid,
			Streams: map[string]HubStream{AckedStream: {LastSeq: lastSeq}, "VIEWS": {LastSeq: 7}}, Consumers: consumers}
	}
	hub := func(servers ...HubServer) []HubServer { return servers }
	c.checkHub(at(0), hub(server("0", 100, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 3, AckFloor: 97}), server("1", 100), server("2", 99)), 3)
	c.checkHub(at(1), hub(server("0", 104, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 2, AckFloor: 102}), server("1", 104), server("2", 104)), 3)
	// Server 0 killed: 1 restarts below, 2 holds everything.
	c.checkHub(at(2), hub(server("1", 90), server("2", 104)), 2)
	// 2 does not answer, then the pods cannot be listed: nothing judged.
	c.checkHub(at(3), hub(server("1", 90)), 2)
	c.checkHub(at(4), hub(server("1", 90)), 2)
	c.checkHub(at(5), nil, 0)
	c.checkHub(at(6), nil, 0)
	// Once short, then caught up.
	c.checkHub(at(7), hub(server("1", 101), server("2", 101)), 2)
	c.checkHub(at(8), hub(server("0", 110), server("1", 110), server("2", 110)), 3)
	if len(c.violations) != 0 {
		t.Fatalf("a moving backlog, a server behind, a shortfall seen once: %+v", c.violations)
	}
	// Short twice in a row with every server answering: lost.
	c.checkHub(at(9), hub(server("0", 90), server("1", 90), server("2", 90)), 3)
	c.checkHub(at(10), hub(server("0", 120, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 500, AckFloor: 110}), server("1", 90), server("2", 90)), 3)
	c.checkHub(at(11), hub(server("0", 120, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 500, AckFloor: 110}), server("1", 90), server("2", 90)), 3)
	c.checkHub(at(12), hub(server("0", 90), server("1", 90), server("2", 90)), 3)
	c.checkHub(at(13), hub(server("0", 80), server("1", 80), server("2", 80)), 3)
	want := []string{"consumer/HEALTH/ballots", "consumer/HEALTH/ballots", "stream/HEALTH"}
	if len(c.violations) != len(want) {
		t.Fatalf("violations %+v, want on %v", c.violations, want)
	}
	for i, v := range c.violations {
		if v.Object != want[i] || v.Invariant != InvViews {
			t.Errorf("violation %d: %+v, want invariant %d on %s", i, v, InvViews, want[i])
		}
	}
	if c.hub.worstBacklog != 500 {
		t.Errorf("worst backlog %d, want 500", c.hub.worstBacklog)
	}
	// A hub remade with none of the old pods starts again.
	c.checkHub(at(14), hub(server("n", 3)), 1)
	c.checkHub(at(15), hub(server("n", 5)), 1)
	if len(c.violations) != len(want) {
		t.Errorf("a hub remade without its volume: %+v", c.violations[len(want):])
	}

	// During a fault a backlog is no violation.
	c = testChecker(t)
	c.play(Fault{Kind: UnitCut, Unit: "a"}, time.Minute, 0)
	c.checkHub(now, hub(server("0", 100, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 5000})), 1)
	c.checkHub(at(1), hub(server("0", 100, HubConsumer{Stream: AckedStream, Name: "ballots", Pending: 5000})), 1)
	if len(c.violations) != 0 {
		t.Errorf("a backlog during a unit cut: %+v", c.violations)
	}
}

// A process's established TCP connections are counted from its own
// descriptors: both ends of a loopback connection, not the listener.
func TestConnectionsCountsEstablishedSockets(t *testing.T) {
	dir := "/proc/" + strconv.Itoa(os.Getpid())
	count := func() int {
		fds, err := os.ReadDir(dir + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		return connections(dir, fds)
	}
	before := count()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if got := count(); got != before+2 {
		t.Errorf("%d established connections, want %d", got, before+2)
	}
}

// A Node write that leaves what Atoll owns there as the last one left it
// answers no transition; a changed verdict or hold does, and a refused
// write (a stale resourceVersion) stores nothing.
func TestCheckerJudgesNodeWrites(t *testing.T) {
	c := testChecker(t)
	now := time.Now()
	write := func(code int, annotations string) kubetest.AuditEvent {
		e := kubetest.AuditEvent{Received: now, Verb: "patch"}
		e.ObjectRef.Resource, e.ObjectRef.Name = "nodes", "edge-a1"
		e.ResponseStatus.Code = code
		e.ResponseObject = json.RawMessage(`{"metadata":{"annotations":{` + annotations + `}}}`)
		return e
	}
	for _, e := range []kubetest.AuditEvent{
		write(200, `"atoll.io/health-verdict":"none"`),
		write(200, `"atoll.io/health-verdict":"healthy","atoll.io/health-verdict-since":"2026-12-01T00:57:21Z"`),
		write(422, `"atoll.io/health-verdict":"healthy","atoll.io/health-verdict-since":"2026-12-01T00:57:21Z"`),
		write(200, `"atoll.io/health-verdict":"healthy","atoll.io/health-verdict-since":"2026-12-01T00:57:21Z","atoll.io/unit-hold-until":"2026-12-01T01:20:00Z"`),
	} {
		c.checkNodeWrite(e)
	}
	if len(c.violations) != 0 {
		t.Fatalf("each write a transition: %+v", c.violations)
	}
	c.checkNodeWrite(write(200, `"atoll.io/health-verdict":"healthy","atoll.io/health-verdict-since":"2026-12-01T00:57:21Z","atoll.io/unit-hold-until":"2026-12-01T01:20:00Z","other":"x"`))
	if len(c.violations) != 1 || c.violations[0].Invariant != InvQuiet || c.violations[0].Object != "nodes//edge-a1" {
		t.Errorf("a write with no transition: %+v", c.violations)
	}
}

// CPU times come from /proc: the process's own grow as it works, and
// the machine's busy time is part of its total.
func TestCPUTimes(t *testing.T) {
	dir := "/proc/" + strconv.Itoa(os.Getpid())
	before := procCPU(dir)
	for x, end := 0, time.Now().Add(300*time.Millisecond); time.Now().Before(end); x++ {
		_ = x * x
	}
	if after := procCPU(dir); after <= before {
		t.Errorf("CPU time %v after working, %v before", after, before)
	}
	if busy, total := machineCPU(); busy <= 0 || total < busy {
		t.Errorf("machine: busy %v of %v", busy, total)
	}
	// user nice system idle iowait irq softirq steal guest guest_nice:
	// the guest columns are already in user and nice.
	busy, total := statCPU("cpu  100 20 30 400 50 6 7 8 90 10")
	if busy != 1.71 || total != 6.21 {
		t.Errorf("statCPU: busy %v of %v, want 1.71 of 6.21", busy, total)
	}
}

// A component's cores are its processes' CPU time over the time between
// two samples, however late the second came; a process first seen waits
// for its next sample.
func TestCheckerCPU(t *testing.T) {
	c := testChecker(t)
	t0 := time.Now()
	c.cpu(&Sample{T: t0, Procs: []ProcUsage{{Comm: "atoll-edge", PID: 1, CPU: 10}}})
	s := Sample{T: t0.Add(20 * time.Second), Procs: []ProcUsage{
		{Comm: "atoll-edge", PID: 1, CPU: 20},
		{Comm: "atoll-edge", PID: 2, CPU: 50},
	}}
	c.cpu(&s)
	if got := s.CPU["atoll-edge"]; math.Abs(got-0.5) > 1e-9 {
		t.Errorf("atoll-edge used %v cores, want 0.5", got)
	}
}

// The kube-apiserver failing kubelets with no restart of it in force is
// a stall: from StallErrors server errors on, what atoll-cloud writes
// then and for QuietAfter after follows real transitions, and the report
// names it. Fewer errors, or errors during a scheduled restart, are no
// stall.
func TestCheckerJudgesStalls(t *testing.T) {
	c := testChecker(t)
	t0 := time.Now().Add(-time.Hour)
	c.truth.add([]Entry{{T: t0.Add(-time.Hour), Phase: PhaseStart}})
	audit := filepath.Join(t.TempDir(), "audit.log")
	line := func(at time.Time, user string, code int, verb string) string {
		return fmt.Sprintf(`{"verb":%q,"user":{"username":%q},"objectRef":{"resource":"leases","name":"x"},"responseStatus":{"metadata":{},"code":%d},"requestReceivedTimestamp":%q}`+"\n",
			verb, user, code, at.UTC().Format(time.RFC3339Nano))
	}
	content := line(t0, "system:node:edge-a1", 500, "update") +
		line(t0.Add(time.Second), "system:node:edge-a2", 504, "update") +
		line(t0.Add(2*time.Second), "system:node:edge-a1", 200, "update") +
		line(t0.Add(3*time.Second), "system:serviceaccount:kube-system:node-controller", 500, "patch") +
		line(t0.Add(4*time.Second), "system:node:edge-a3", 500, "update") +
		line(t0.Add(5*time.Second), "cloud", 200, "patch")
	if err := os.WriteFile(audit, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	writes, failed := c.audit.audit(audit, "cloud")
	if len(writes) != 1 || len(failed) != 3 {
		t.Fatalf("read %d writes and %d kubelet server errors, want 1 and 3", len(writes), len(failed))
	}
	for _, at := range failed[:2] {
		c.truth.serverError(at)
	}
	if !c.truth.quiet(t0.Add(time.Minute)) {
		t.Error("two server errors made a stall")
	}
	c.truth.serverError(failed[2])
	if c.truth.quiet(t0.Add(time.Minute)) || c.truth.quiet(t0.Add(4*time.Second+QuietAfter)) {
		t.Error("quiet during a stall or within QuietAfter of its end")
	}
	if !c.truth.quiet(t0.Add(5*time.Second + QuietAfter)) {
		t.Error("not quiet QuietAfter after the stall")
	}
	st := c.truth.stalled(time.Time{}, time.Now())
	if len(st) != 1 || !st[0].From.Equal(t0) || !st[0].To.Equal(t0.Add(4*time.Second)) || st[0].Errors != 3 {
		t.Fatalf("stalls %+v", st)
	}
	// During a scheduled restart (and the minute after), errors are the
	// restart's.
	c.play(Fault{ID: 9, Kind: APIServerRestart}, 10*time.Minute, time.Minute)
	restart := time.Now().Add(-10 * time.Minute)
	for i := range 5 {
		c.truth.serverError(restart.Add(time.Duration(i) * 20 * time.Second))
	}
	if got := c.truth.stalled(restart, time.Now()); len(got) != 0 {
		t.Errorf("a scheduled restart made stalls %+v", got)
	}
	if s := Summary(Result{Stalls: st}); !strings.Contains(s, "kube-apiserver stalls with no fault in force: 1") {
		t.Errorf("the summary does not name the stall:\n%s", s)
	}
}

// KCM taints a dead node only while it and the kube-apiserver run: a
// restart of either after the power cut moves the bound to its end.
func TestCheckerCountsDeadTaintFromTheControlPlane(t *testing.T) {
	for _, restart := range []bool{true, false} {
		c := testChecker(t)
		dies := Fault{ID: 1, Kind: NodeDies, Unit: "a", Node: "edge-a2"}
		c.play(dies, 3*time.Minute, 0)
		if restart {
			c.play(Fault{ID: 2, Kind: APIServerRestart}, 170*time.Second, 140*time.Second)
		}
		c.onNode(tainted("edge-a2")) // 3 min after the power cut, 30 s after the restart
		c.truth.add([]Entry{{T: time.Now().Add(time.Second), Phase: PhaseEnd, Fault: dies}})
		c.checkDead()
		late := slices.ContainsFunc(c.violations, func(v Violation) bool {
			return v.Invariant == InvDeadEvicted && v.Object == "node/edge-a2"
		})
		if late == restart {
			t.Errorf("apiserver restart %v: taint reported late %v: %+v", restart, late, c.violations)
		}
	}
}
