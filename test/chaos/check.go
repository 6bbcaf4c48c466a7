package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// Invariants the checker holds the installation to.
const (
	// InvProtected: no unreachable:NoExecute taint (beyond TaintBound),
	// eviction or not-ready endpoint for a node that is alive and
	// reachable by its peers.
	InvProtected = 1
	// InvDeadEvicted: a dead node is tainted within Grace +
	// DeadTaintBound and its pods deleted within Toleration + EvictBound
	// of the taint.
	InvDeadEvicted = 2
	// InvQuiet: atoll-cloud writes nothing but its Lease while nothing
	// happens, and writes a Node only to change what it owns there.
	InvQuiet = 3
	// InvViews: a linked agent's view feeds catch up within ViewsBound;
	// the hub loses no acknowledged ballot, and its durable consumers
	// keep up while nothing happens (checkHub).
	InvViews = 4
	// InvClients: a unit's client succeeds while its unit is cut from the
	// cloud, and is answered by its own unit.
	InvClients = 5
	// InvFlat: memory and descriptors flat after warm-up.
	InvFlat = 6
)

// Violation is an invariant broken: when, what, and the faults in force.
type Violation struct {
	T         time.Time `json:"t"`
	Invariant int       `json:"invariant"`
	Object    string    `json:"object"`
	Detail    string    `json:"detail"`
	Faults    []string  `json:"faults,omitempty"`
}

// Sample is what the checker measured over one sampling period.
type Sample struct {
	T     time.Time        `json:"t"`
	Usage map[string]Usage `json:"usage"`
	Procs []ProcUsage      `json:"procs"`
	// Writes and LeaseWrites are atoll-cloud's writes in the period;
	// Reviews its TokenReviews (which store nothing).
	Writes      int `json:"writes"`
	LeaseWrites int `json:"leaseWrites"`
	Reviews     int `json:"reviews,omitempty"`
	// Calls are each unit's client calls in the period: ok, failed.
	Calls  map[string][2]int `json:"calls"`
	Faults int               `json:"faults"`
	// Agents are the agents that answered, by node.
	Agents map[string]AgentMetrics `json:"agents"`
	// Hub are the hub's servers that answered.
	Hub []HubServer `json:"hub,omitempty"`
	// HubRunning is how many of the hub's pods ran.
	HubRunning int `json:"hubRunning,omitempty"`
	// CPU is what each component's processes used in the period, and
	// Machine what the whole machine did (everything on it, the control
	// plane, the nodes and the checker included), in cores.
	CPU     map[string]float64 `json:"cpu,omitempty"`
	Machine float64            `json:"machineCores,omitempty"`
}

// SampleEvery is the checker's sampling period.
const SampleEvery = 15 * time.Second

// maxPerObject is how many violations of one invariant and object are
// written out; the rest are counted.
const maxPerObject = 20

// Checker watches an installation from the outside — the apiserver, the
// audit log, the nodes' container logs and /proc — and checks the
// invariants against what the journal says happened. It never asks Atoll.
type Checker struct {
	plan    Plan
	dir     string
	log     *slog.Logger
	client  kubernetes.Interface
	truth   truth
	journal *JournalReader
	logs    tailer
	audit   tailer
	edges   map[string]string // edge node → unit

	mu          sync.Mutex
	taintSince  map[string]time.Time   // node → unreachable:NoExecute first seen
	taintSeen   map[string][]time.Time // node → every such first sighting
	reported    map[string]bool        // node whose taint was reported
	notReady    map[string]time.Time   // node → last seen Ready=False by its kubelet
	ready       map[string]bool        // endpoint's pod UID → ready
	podNode     map[string]string      // workload pod → its node
	deleted     map[string]time.Time   // workload pod → deletion first seen
	snapshots   map[int][]string       // NodeDies fault → the pods on its node then
	evaluated   map[int]bool
	violations  []Violation
	perObject   map[string]int
	dropped     int
	samples     []Sample
	vout, sout  *os.File
	bounds      Bounds
	calls       map[string]*CallStats
	writeCounts map[string]int // object → atoll-cloud writes (Leases apart)
	// procCPU: process → its CPU seconds at the last sample; busy and
	// total the machine's, then.
	procCPU     map[int]float64
	busy, total float64
	cpuAt       time.Time
	// nodeState: Node → the annotations Atoll owns on it, as atoll-cloud's
	// last write left them.
	nodeState map[string]string
	hub       hubState
	// containersNotReady: workload pod → when its ContainersReady was
	// last seen False (the kubelet's own judgement of its containers;
	// the node lifecycle controller turns only Ready False).
	containersNotReady map[string]time.Time
	turned             []turnedNotReady // endpoints turned not ready, judged once the pods are current
	// foreign: calls answered by a pod of another unit, judged once the
	// journal has the faults begun before them (journalLag).
	foreign []foreignCall
}

// foreignCall is an answer from another unit's pod, with the node that
// pod ran on when the answer was read.
type foreignCall struct {
	Call
	podNode string
}

// journalLag is how long after a fault begins its journal entry may come:
// the injector writes it once the fault is made, and a kube-apiserver
// restart is made when the apiserver serves again (up to 4.5 min on this
// machine); a relabel during a stall took seconds. An answer from another
// unit is judged this long after it, so the relabel that explains it is
// known.
const journalLag = 5 * time.Minute

// turnedNotReady is an endpoint of a live edge node seen turning not
// ready, waiting for its judgement.
type turnedNotReady struct {
	t                time.Time
	pod, slice, node string
}

// podsCatchUp is how long the checker waits before judging an endpoint
// turned not ready: its pod's status, on another watch, may come later.
const podsCatchUp = 5 * time.Second

// Bounds are the worst times seen.
type Bounds struct {
	// ProtectedTaint is the longest unreachable:NoExecute on a node that
	// was protected.
	ProtectedTaint time.Duration `json:"protectedTaint"`
	// DeadTaint is the longest time from a power cut to the node's taint;
	// DeadEvict from the taint to its last pod's deletion.
	DeadTaint time.Duration `json:"deadTaint"`
	DeadEvict time.Duration `json:"deadEvict"`
	// ConsumerBacklog is the largest backlog of a durable consumer of
	// the hub seen in a quiet period; HubSamples how many samples read
	// the hub's servers (0: the hub was not watched).
	ConsumerBacklog uint64 `json:"consumerBacklog"`
	HubSamples      int    `json:"hubSamples"`
	// ContainersNotReady counts endpoints of live nodes turned not ready
	// because the kubelet found their containers not ready (no
	// violation).
	ContainersNotReady int `json:"containersNotReady"`
}

// CallStats count a unit's client calls.
type CallStats struct {
	OK, Failed             int
	CutOK, CutFailed       int // while the unit was cut from the cloud
	Foreign                int // answered by another unit
	OtherFaultOK, OtherBad int // while another fault touched the unit
}

// NewChecker checks the run of dir (its Plan and journal).
func NewChecker(dir string, log *slog.Logger) (*Checker, error) {
	plan, err := ReadPlan(dir)
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", plan.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("chaos: kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return newChecker(plan, dir, log, client), nil
}

func newChecker(plan Plan, dir string, log *slog.Logger, client kubernetes.Interface) *Checker {
	c := &Checker{plan: plan, dir: dir, log: log, client: client,
		journal: NewJournalReader(filepath.Join(dir, JournalFile)), edges: map[string]string{},
		taintSince: map[string]time.Time{}, taintSeen: map[string][]time.Time{}, reported: map[string]bool{},
		notReady: map[string]time.Time{}, ready: map[string]bool{}, podNode: map[string]string{},
		deleted: map[string]time.Time{}, snapshots: map[int][]string{}, evaluated: map[int]bool{},
		perObject: map[string]int{}, calls: map[string]*CallStats{}, writeCounts: map[string]int{}, nodeState: map[string]string{}, procCPU: map[int]float64{},
		hub:                hubState{last: map[string]uint64{}, short: map[string]time.Time{}, pods: map[string]bool{}, backlog: map[string]HubConsumer{}},
		containersNotReady: map[string]time.Time{}}
	for unit, nodes := range plan.Schedule.Topology.Units {
		for _, n := range nodes {
			c.edges[n] = unit
		}
		c.calls[unit] = &CallStats{}
	}
	return c
}

// Run checks until the journal says the schedule is done, then writes
// the summary and the report. It returns the violations.
func (c *Checker) Run(ctx context.Context) ([]Violation, error) {
	var err error
	if c.vout, err = os.Create(filepath.Join(c.dir, ViolationsFile)); err != nil {
		return nil, err
	}
	defer c.vout.Close()
	if c.sout, err = os.Create(filepath.Join(c.dir, SamplesFile)); err != nil {
		return nil, err
	}
	defer c.sout.Close()

	f := informers.NewSharedInformerFactoryWithOptions(c.client, 0, informers.WithNamespace(c.plan.Namespace))
	nodes := informers.NewSharedInformerFactory(c.client, 0).Core().V1().Nodes().Informer()
	pods := f.Core().V1().Pods().Informer()
	eps := f.Discovery().V1().EndpointSlices().Informer()
	handlers := []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{{nodes, c.onNode}, {pods, c.onPod}, {eps, c.onSlice}}
	for _, h := range handlers {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    h.fn,
			UpdateFunc: func(_, obj any) { h.fn(obj) },
		}); err != nil {
			return nil, err
		}
		go h.inf.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), nodes.HasSynced, pods.HasSynced, eps.HasSynced) {
		return nil, ctx.Err()
	}
	c.log.Info("chaos: checker watching", "namespace", c.plan.Namespace, "edges", len(c.edges))
	c.audit.audit(c.plan.AuditLog, c.plan.CloudUser) // the installation's: not judged

	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	nextSample := time.Now().Add(SampleEvery)
	for {
		select {
		case <-ctx.Done():
			return c.finish()
		case now := <-tick.C:
			entries, err := c.journal.Next()
			if err != nil {
				return nil, err
			}
			c.truth.add(entries)
			for _, e := range entries {
				if e.Phase == PhaseBegin && e.Fault.Kind == NodeDies {
					c.snapshot(e.Fault)
				}
			}
			c.checkTaints(now)
			c.judgeTurned(now)
			c.checkDead()
			if now.After(nextSample) {
				c.sample(now)
				nextSample = now.Add(SampleEvery)
			}
			if done, ok := c.truth.finished(); ok && now.After(done) {
				c.sample(now)
				return c.finish()
			}
		}
	}
}

// violate records a violation, with the faults in force at t.
func (c *Checker) violate(t time.Time, inv int, object, format string, args ...any) {
	v := Violation{T: t, Invariant: inv, Object: object, Detail: fmt.Sprintf(format, args...)}
	for _, f := range c.truth.active(t) {
		v.Faults = append(v.Faults, f.String())
	}
	for _, st := range c.truth.stalled(t.Add(-QuietAfter), t) {
		v.Faults = append(v.Faults, st.String())
	}
	key := fmt.Sprintf("%d/%s", inv, object)
	c.perObject[key]++
	if c.perObject[key] > maxPerObject {
		c.dropped++
		return
	}
	c.violations = append(c.violations, v)
	c.log.Warn("chaos: VIOLATION", "invariant", inv, "object", object, "detail", v.Detail, "faults", v.Faults)
	b, _ := json.Marshal(v)
	_, _ = c.vout.Write(append(b, '\n'))
}

// exempt tells whether Kubernetes may act on node at t without Atoll
// failing: it was powered off around then, or its kubelet itself said
// it was not ready.
func (c *Checker) exempt(node string, t time.Time) bool {
	if c.truth.died(node, t.Add(-c.plan.Grace-DeadTaintBound-c.plan.Toleration-EvictBound), t) {
		return true
	}
	last, ok := c.notReady[node]
	return ok && t.Sub(last) < time.Minute
}

func (c *Checker) onNode(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cond := range n.Status.Conditions {
		if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionFalse {
			c.notReady[n.Name] = now
		}
	}
	if _, edge := c.edges[n.Name]; !edge {
		return
	}
	tainted := slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
		return t.Key == corev1.TaintNodeUnreachable && t.Effect == corev1.TaintEffectNoExecute
	})
	_, was := c.taintSince[n.Name]
	switch {
	case tainted && !was:
		c.taintSince[n.Name] = now
		c.taintSeen[n.Name] = append(c.taintSeen[n.Name], now)
	case !tainted && was:
		if !c.exempt(n.Name, now) {
			c.bounds.ProtectedTaint = max(c.bounds.ProtectedTaint, now.Sub(c.taintSince[n.Name]))
		}
		delete(c.taintSince, n.Name)
		delete(c.reported, n.Name)
	}
}

// checkTaints reports a node protected by the truth that carried
// unreachable:NoExecute for longer than TaintBound.
func (c *Checker) checkTaints(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for node, since := range c.taintSince {
		if c.reported[node] || now.Sub(since) <= TaintBound || c.exempt(node, now) {
			continue
		}
		c.reported[node] = true
		c.violate(since, InvProtected, "node/"+node, "alive and reachable by its peers, tainted unreachable:NoExecute for over %s", TaintBound)
	}
}

func (c *Checker) onPod(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.podNode[p.Name] = p.Spec.NodeName
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.ContainersReady && cond.Status == corev1.ConditionFalse {
			c.containersNotReady[p.Name] = now
		}
	}
	if p.DeletionTimestamp == nil {
		return
	}
	if _, seen := c.deleted[p.Name]; seen {
		return
	}
	c.deleted[p.Name] = now
	if _, edge := c.edges[p.Spec.NodeName]; edge && !c.exempt(p.Spec.NodeName, now) {
		c.violate(now, InvProtected, "pod/"+p.Name, "deleted on %s, alive and reachable by its peers", p.Spec.NodeName)
	}
}

func (c *Checker) onSlice(obj any) {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range s.Endpoints {
		if ep.TargetRef == nil || ep.NodeName == nil {
			continue
		}
		uid := string(ep.TargetRef.UID)
		ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
		terminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
		was, known := c.ready[uid]
		c.ready[uid] = ready
		if !known || !was || ready || terminating {
			continue
		}
		if _, edge := c.edges[*ep.NodeName]; edge && !c.exempt(*ep.NodeName, now) {
			c.turned = append(c.turned, turnedNotReady{t: now, pod: ep.TargetRef.Name, slice: s.Name, node: *ep.NodeName})
		}
	}
}

// judgeTurned judges the endpoints turned not ready podsCatchUp ago or
// more: a violation unless the kubelet itself found the pod's containers
// not ready around then (a failing readiness probe is the workload's
// own verdict, which Atoll does not overrule).
func (c *Checker) judgeTurned(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	waiting := c.turned[:0]
	for _, e := range c.turned {
		if now.Sub(e.t) < podsCatchUp {
			waiting = append(waiting, e)
			continue
		}
		if last, ok := c.containersNotReady[e.pod]; ok && last.After(e.t.Add(-time.Minute)) {
			c.bounds.ContainersNotReady++
			continue
		}
		c.violate(e.t, InvProtected, "pod/"+e.pod, "endpoint in %s turned not ready on %s, alive and reachable by its peers, its containers ready",
			e.slice, e.node)
	}
	c.turned = waiting
}

// snapshot records the workload's pods on a node that just died.
func (c *Checker) snapshot(f Fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var pods []string
	for pod, node := range c.podNode {
		if _, gone := c.deleted[pod]; node == f.Node && !gone {
			pods = append(pods, pod)
		}
	}
	c.snapshots[f.ID] = pods
}

// checkDead checks each NodeDies that ended: the node was tainted and
// its pods deleted in time.
func (c *Checker) checkDead() {
	c.truth.mu.Lock()
	var ended []*episode
	for _, ep := range c.truth.episodes {
		if ep.f.Kind == NodeDies && !ep.end.IsZero() && ep.failed == "" {
			ended = append(ended, ep)
		}
	}
	c.truth.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ep := range ended {
		if c.evaluated[ep.f.ID] {
			continue
		}
		c.evaluated[ep.f.ID] = true
		node := ep.f.Node
		var taint time.Time
		for _, t := range c.taintSeen[node] {
			if !t.Before(ep.begin) && t.Before(ep.end) {
				taint = t
				break
			}
		}
		if since, ok := c.taintSince[node]; taint.IsZero() && ok && since.Before(ep.begin) {
			taint = ep.begin // tainted already (a cut before): as good as at once
		}
		// KCM taints only while it and the kube-apiserver run: the bound
		// counts from when the last restart or stall of either in force
		// since the power cut ended.
		from := c.truth.controlPlaneBack(ep.begin, later(taint, ep.end))
		deadline := from.Add(c.plan.Grace + DeadTaintBound)
		if taint.IsZero() {
			c.violate(ep.end, InvDeadEvicted, "node/"+node, "dead for %s, never tainted unreachable:NoExecute", ep.end.Sub(ep.begin).Round(time.Second))
			continue
		}
		c.bounds.DeadTaint = max(c.bounds.DeadTaint, taint.Sub(ep.begin))
		if taint.After(deadline) {
			c.violate(taint, InvDeadEvicted, "node/"+node, "tainted %s after its power cut, %s after the control plane was back (bound %s)",
				taint.Sub(ep.begin).Round(time.Second), taint.Sub(from).Round(time.Second), c.plan.Grace+DeadTaintBound)
		}
		for _, pod := range c.snapshots[ep.f.ID] {
			del, ok := c.deleted[pod]
			if !ok || del.After(ep.end) {
				c.violate(ep.end, InvDeadEvicted, "pod/"+pod, "on %s, dead for %s, not deleted", node, ep.end.Sub(ep.begin).Round(time.Second))
				continue
			}
			c.bounds.DeadEvict = max(c.bounds.DeadEvict, del.Sub(taint))
			if del.Sub(taint) > c.plan.Toleration+EvictBound {
				c.violate(del, InvDeadEvicted, "pod/"+pod, "deleted %s after %s's taint (bound %s)",
					del.Sub(taint).Round(time.Second), node, c.plan.Toleration+EvictBound)
			}
		}
	}
}

// cpu fills s's CPU from what each process and the machine used since
// the last sample, over the time between the two (a sample can be late:
// a slow apiserver holds the checker up); a process first seen counts
// from its next sample.
func (c *Checker) cpu(s *Sample) {
	busy, total := machineCPU()
	if c.total > 0 && total > c.total {
		s.Machine = float64(runtime.NumCPU()) * (busy - c.busy) / (total - c.total)
	}
	c.busy, c.total = busy, total
	seen := map[int]float64{}
	elapsed := s.T.Sub(c.cpuAt).Seconds()
	for _, p := range s.Procs {
		if prev, ok := c.procCPU[p.PID]; ok && p.CPU >= prev && elapsed > 0 {
			if s.CPU == nil {
				s.CPU = map[string]float64{}
			}
			s.CPU[p.Comm] += (p.CPU - prev) / elapsed
		}
		seen[p.PID] = p.CPU
	}
	c.procCPU, c.cpuAt = seen, s.T
}

// checkNodeWrite judges a write of atoll-cloud's to a Node: what Atoll
// owns there (its verdict and since, its unit's hold) moves only with a
// transition, so a write that leaves them as the last one left them
// answers none. Call with c.mu held.
func (c *Checker) checkNodeWrite(e kubetest.AuditEvent) {
	if e.ObjectRef.Resource != "nodes" || e.ResponseStatus.Code >= 300 || len(e.ResponseObject) == 0 {
		return
	}
	var node struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if json.Unmarshal(e.ResponseObject, &node) != nil {
		return
	}
	a := node.Metadata.Annotations
	owned := fmt.Sprintf("verdict %q since %q, hold until %q",
		a[wellknown.AnnotationVerdict], a[wellknown.AnnotationVerdictSince], a[wellknown.AnnotationHoldUntil])
	if prev, ok := c.nodeState[e.ObjectRef.Name]; ok && prev == owned {
		c.violate(e.Received, InvQuiet, e.Object(), "atoll-cloud wrote the Node leaving what it owns there as it was (%s): a write with no transition", owned)
	}
	c.nodeState[e.ObjectRef.Name] = owned
}

// sample measures the period that ends now and checks the clients' calls
// and atoll-cloud's writes of it.
func (c *Checker) sample(now time.Time) {
	s := Sample{T: now, Calls: map[string][2]int{}, Faults: len(c.truth.active(now))}
	s.Usage, s.Procs = usage(c.plan.Net)
	c.cpu(&s)
	writes, failed := c.audit.audit(c.plan.AuditLog, c.plan.CloudUser)
	for _, at := range failed {
		c.truth.serverError(at)
	}
	for _, e := range writes {
		switch {
		case leaseWrite(e):
			s.LeaseWrites++
			continue
		case review(e):
			s.Reviews++
			continue
		}
		s.Writes++
		c.mu.Lock()
		c.writeCounts[e.Object()]++
		if c.truth.quiet(e.Received) {
			c.violate(e.Received, InvQuiet, e.Object(), "atoll-cloud wrote (%s) while nothing happened", e.Verb)
		}
		c.checkNodeWrite(e)
		c.mu.Unlock()
	}
	s.Agents = agentMetrics(context.Background(), c.plan.Agents, c.plan.AdminToken)
	if c.plan.HubSelector != "" {
		s.Hub, s.HubRunning = hubServers(context.Background(), c.client, c.plan.HubNamespace, c.plan.HubSelector, c.plan.HubMonitorPort)
		c.mu.Lock()
		c.checkHub(now, s.Hub, s.HubRunning)
		if len(s.Hub) > 0 {
			c.bounds.HubSamples++
		}
		c.bounds.ConsumerBacklog = c.hub.worstBacklog
		c.mu.Unlock()
	}
	for _, node := range slices.Sorted(maps.Keys(s.Agents)) {
		if behind := time.Duration(s.Agents[node].Behind * float64(time.Second)); behind > ViewsBound {
			c.mu.Lock()
			c.violate(now, InvViews, "agent/"+node, "a view feed has been behind for %s while linked (bound %s)", behind.Round(time.Second), ViewsBound)
			c.mu.Unlock()
		}
	}
	calls := c.logs.calls(c.plan.Disks, c.plan.Namespace)
	start, started := c.truth.started()
	c.mu.Lock()
	for _, call := range calls {
		// The warm-up settles the workload: its calls are not judged.
		if started && !call.T.Before(start) {
			c.call(call, s.Calls)
		}
	}
	c.judgeForeign(now.Add(-journalLag))
	c.samples = append(c.samples, s)
	c.mu.Unlock()
	b, _ := json.Marshal(s)
	_, _ = c.sout.Write(append(b, '\n'))
}

func (c *Checker) call(call Call, counts map[string][2]int) {
	st := c.calls[call.Unit]
	if st == nil {
		st = &CallStats{}
		c.calls[call.Unit] = st
	}
	n := counts[call.Unit]
	cut := c.truth.unitCut(call.Unit, call.T, call.T)
	touched := len(c.truth.overlapping(call.T.Add(-Settle), call.T, func(f Fault) bool { return f.Unit == call.Unit || f.To == call.Unit })) > 0
	switch {
	case call.OK:
		n[0]++
		st.OK++
		if cut {
			st.CutOK++
		} else if touched {
			st.OtherFaultOK++
		}
		if unit, _, _ := strings.Cut(strings.TrimPrefix(call.Detail, "web-"), "-"); unit != call.Unit {
			c.foreign = append(c.foreign, foreignCall{call, c.podNode[call.Detail]})
		}
	default:
		n[1]++
		st.Failed++
		if cut {
			st.CutFailed++
			c.violate(call.T, InvClients, "unit/"+call.Unit, "the client on %s failed while its unit was cut from the cloud: %s", call.Node, call.Detail)
		} else if touched {
			st.OtherBad++
		}
	}
	counts[call.Unit] = n
}

// judgeForeign judges the answers from another unit given up to before:
// each must come from a node moved into the client's unit, or be from a
// pod on a node moved out of it, lately (Settle). The caller holds c.mu.
func (c *Checker) judgeForeign(before time.Time) {
	kept := c.foreign[:0]
	for _, call := range c.foreign {
		if call.T.After(before) {
			kept = append(kept, call)
			continue
		}
		if !c.truth.moved(call.Node, call.T.Add(-Settle), call.T) && !c.truth.moved(call.podNode, call.T.Add(-Settle), call.T) {
			c.calls[call.Unit].Foreign++
			c.violate(call.T, InvClients, "unit/"+call.Unit, "the client on %s was answered by %s, of another unit", call.Node, call.Detail)
		}
	}
	c.foreign = kept
}

// Result is the checker's summary of a run.
type Result struct {
	Schedule   Schedule              `json:"schedule"`
	Violations []Violation           `json:"violations"`
	Dropped    int                   `json:"dropped"`
	Bounds     Bounds                `json:"bounds"`
	Calls      map[string]*CallStats `json:"calls"`
	// Slopes are each component's growth (growth).
	Slopes map[string]Slope `json:"slopes"`
	// Writes are atoll-cloud's writes (Leases apart); MaxPerObject the
	// most to one object. Reviews are its TokenReviews.
	Writes, LeaseWrites, Reviews int
	MaxPerObject                 int
	MaxObject                    string
	// Start is the schedule's time 0; Played the faults as they happened.
	Start  time.Time `json:"start"`
	Played []Played  `json:"played"`
	// Stalls are the kube-apiserver's stalls no fault made.
	Stalls  []Stall  `json:"stalls"`
	Samples []Sample `json:"samples"`
}

// finish evaluates what needs the whole run and writes the summary and
// the report.
func (c *Checker) finish() ([]Violation, error) {
	c.judgeTurned(time.Now().Add(podsCatchUp))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.judgeForeign(time.Now()) // the journal is whole
	r := Result{Schedule: c.plan.Schedule, Bounds: c.bounds, Calls: c.calls, Slopes: map[string]Slope{}, Samples: c.samples}
	for _, s := range c.samples {
		r.Writes += s.Writes
		r.LeaseWrites += s.LeaseWrites
		r.Reviews += s.Reviews
	}
	for _, obj := range slices.Sorted(maps.Keys(c.writeCounts)) {
		if n := c.writeCounts[obj]; n > r.MaxPerObject {
			r.MaxPerObject, r.MaxObject = n, obj
		}
	}
	if n := len(c.samples); n > 0 {
		last := c.samples[n-1].T
		for _, comp := range components {
			slope, judged := growth(c.samples, comp, last)
			r.Slopes[comp] = slope
			if judged == 0 {
				continue
			}
			// Growth of a tenth of the process's mean RSS per hour
			// (beside its established connections), or two
			// descriptors per hour other than those connections, by
			// the median process judged.
			if slope.RSS > 0.1*slope.MeanRSS || slope.FDs > 2 {
				c.violate(last, InvFlat, "component/"+comp, "grows: %+.1f MiB/h (mean %.0f MiB), %+.1f descriptors/h other than connections (median of %d processes that ran %s or more)",
					slope.RSS, slope.MeanRSS, slope.FDs, judged, JudgeAfter)
			}
		}
	}
	r.Violations, r.Dropped = c.violations, c.dropped
	r.Start, _ = c.truth.started()
	r.Played = c.truth.played()
	r.Stalls = c.truth.stalled(time.Time{}, time.Now())
	if err := WriteResult(c.dir, r); err != nil {
		return c.violations, err
	}
	return c.violations, nil
}

// Slope is how a component's processes grow: the median over its
// processes judged of each one's least-squares slope over its last hour.
type Slope struct {
	RSS     float64 `json:"rssMiBPerHour"`
	FDs     float64 `json:"fdsPerHour"`
	MeanRSS float64 `json:"meanRssMiB"`
	// Judged is how many processes ran long enough to be judged.
	Judged int `json:"judged"`
}

// JudgeAfter is how long a process must have been sampled, after its own
// first ten minutes, for its growth to be judged: atoll-cloud killed by
// the schedule every few minutes is judged only where it ran that long.
const JudgeAfter = 30 * time.Minute

// growth is comp's Slope at last, and how many processes it judged.
func growth(samples []Sample, comp string, last time.Time) (Slope, int) {
	type series struct{ ts, rss, fds, conns []float64 }
	byPID := map[int]*series{}
	first := map[int]time.Time{}
	for _, s := range samples {
		for _, p := range s.Procs {
			if p.Comm != comp {
				continue
			}
			if _, ok := first[p.PID]; !ok {
				first[p.PID] = s.T
			}
			// A process's own warm-up and all but its last hour are
			// left out.
			if s.T.Before(first[p.PID].Add(10*time.Minute)) || s.T.Before(last.Add(-time.Hour)) {
				continue
			}
			if byPID[p.PID] == nil {
				byPID[p.PID] = &series{}
			}
			ser := byPID[p.PID]
			ser.ts = append(ser.ts, s.T.Sub(last).Hours())
			ser.rss = append(ser.rss, p.RSSMiB)
			ser.fds = append(ser.fds, float64(p.FDs-p.Conns))
			ser.conns = append(ser.conns, float64(p.Conns))
		}
	}
	var rss, fds, means []float64
	for _, ser := range byPID {
		if n := len(ser.ts); n < 3 || time.Duration((ser.ts[n-1]-ser.ts[0])*float64(time.Hour)) < JudgeAfter {
			continue
		}
		rss = append(rss, fitBeside(ser.ts, ser.conns, ser.rss))
		fds = append(fds, fit(ser.ts, ser.fds))
		means = append(means, mean(ser.rss))
	}
	if len(rss) == 0 {
		return Slope{}, 0
	}
	return Slope{RSS: median(rss), FDs: median(fds), MeanRSS: median(means), Judged: len(rss)}, len(rss)
}

func median(xs []float64) float64 {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// fitBeside is the least-squares slope of ys over xs with zs beside xs
// (ys ≈ a + b·xs + c·zs; b): a server's memory that follows the links it
// holds (more when its peers die and their leafs move to it) is load,
// not growth; a leak grows with time whatever the links. With zs steady
// (or moving with xs alone) it is fit's slope.
func fitBeside(xs, zs, ys []float64) float64 {
	mx, mz, my := mean(xs), mean(zs), mean(ys)
	var sxx, szz, sxz, sxy, szy float64
	for i := range xs {
		dx, dz, dy := xs[i]-mx, zs[i]-mz, ys[i]-my
		sxx += dx * dx
		szz += dz * dz
		sxz += dx * dz
		sxy += dx * dy
		szy += dz * dy
	}
	det := sxx*szz - sxz*sxz
	if szz == 0 || det <= 1e-9*sxx*szz {
		return fit(xs, ys)
	}
	return (sxy*szz - szy*sxz) / det
}

// fit is the least-squares slope of ys over xs.
func fit(xs, ys []float64) float64 {
	mx, my := mean(xs), mean(ys)
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
