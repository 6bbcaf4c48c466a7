package edgesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Errors returned by the Simulator.
var (
	ErrNotStarted  = errors.New("simulator not started")
	ErrUnknownNode = errors.New("node not simulated")
	ErrNodeExists  = errors.New("node already simulated")
)

// callTimeout bounds each API call the simulator makes.
const callTimeout = 15 * time.Second

// podsByNode indexes the pod informer by spec.nodeName.
const podsByNode = "byNode"

// Simulator runs many simulated nodes from one process: it registers Nodes,
// renews their Leases like a kubelet, and runs the pods bound to them
// (reports them Running and Ready, finishes their deletion). A partitioned
// node does none of this until it is healed, as if its cloud link were cut.
type Simulator struct {
	cfg    Config
	client kubernetes.Interface
	log    *slog.Logger

	beats workqueue.TypedDelayingInterface[beat]
	pods  workqueue.TypedRateLimitingInterface[string]

	mu        sync.RWMutex
	nodes     map[string]*node
	nextIndex int

	podInformer  cache.SharedIndexInformer
	nodeInformer cache.SharedIndexInformer
	nodeLister   corelisters.NodeLister
	podLister    corelisters.PodLister

	started atomic.Bool
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	stats stats
}

// beat is one scheduled heartbeat of a node. gen ties it to the node's
// current heartbeat chain: Partition, Heal and RemoveNode bump the node's
// generation, which retires beats already queued.
type beat struct {
	name string
	gen  uint64
}

// New returns a Simulator that talks to the apiserver at rc with its own
// client (protobuf, Config.QPS and Config.Burst).
func New(rc *rest.Config, cfg Config) (*Simulator, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("edgesim config: %w", err)
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = cfg.QPS, cfg.Burst
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.UserAgent = FieldManager
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("edgesim client: %w", err)
	}
	return &Simulator{
		cfg:    cfg,
		client: client,
		log:    cfg.Logger.With("component", "edgesim"),
		beats:  workqueue.NewTypedDelayingQueueWithConfig(workqueue.TypedDelayingQueueConfig[beat]{Name: "edgesim-heartbeats"}),
		pods: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "edgesim-pods"}),
		nodes: map[string]*node{},
	}, nil
}

// Start starts the pod and node informers and the workers, and returns once
// the informers have synced. Everything stops when ctx ends or Stop is called.
func (s *Simulator) Start(ctx context.Context) error {
	if s.started.Load() {
		return errors.New("edgesim: already started")
	}
	s.ctx, s.cancel = context.WithCancel(ctx)

	s.podInformer = coreinformers.NewFilteredPodInformer(s.client, metav1.NamespaceAll, 0,
		cache.Indexers{podsByNode: indexPodByNode},
		func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName!=" })
	s.podLister = corelisters.NewPodLister(s.podInformer.GetIndexer())
	if _, err := s.podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.onPod,
		UpdateFunc: func(_, obj any) { s.onPod(obj) },
		DeleteFunc: s.onPodDelete,
	}); err != nil {
		return fmt.Errorf("edgesim: pod handler: %w", err)
	}
	s.nodeInformer = coreinformers.NewNodeInformer(s.client, 0, cache.Indexers{})
	s.nodeLister = corelisters.NewNodeLister(s.nodeInformer.GetIndexer())
	if _, err := s.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.onNode,
		UpdateFunc: func(_, obj any) { s.onNode(obj) },
	}); err != nil {
		return fmt.Errorf("edgesim: node handler: %w", err)
	}

	s.wg.Go(func() { s.podInformer.Run(s.ctx.Done()) })
	s.wg.Go(func() { s.nodeInformer.Run(s.ctx.Done()) })
	s.wg.Go(func() {
		<-s.ctx.Done()
		s.beats.ShutDown()
		s.pods.ShutDown()
	})
	if !cache.WaitForCacheSync(s.ctx.Done(), s.podInformer.HasSynced, s.nodeInformer.HasSynced) {
		s.Stop()
		return fmt.Errorf("edgesim: wait for informers: %w", context.Cause(s.ctx))
	}
	for range s.cfg.Workers {
		s.wg.Go(s.runHeartbeats)
		s.wg.Go(s.runPods)
	}
	s.started.Store(true)
	return nil
}

// Stop stops the workers and informers and waits for them. Nodes stay
// registered; their Leases simply stop being renewed.
func (s *Simulator) Stop() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.wg.Wait()
}

// AddNodes registers nodes (Node with Ready status, Lease) and starts their
// heartbeats. It registers up to Config.Workers nodes at a time and returns
// the joined errors of the nodes that failed.
func (s *Simulator) AddNodes(ctx context.Context, specs ...NodeSpec) error {
	if !s.started.Load() {
		return ErrNotStarted
	}
	nodes := make([]*node, 0, len(specs))
	var errs []error
	s.mu.Lock()
	for _, spec := range specs {
		if _, ok := s.nodes[spec.Name]; ok {
			errs = append(errs, fmt.Errorf("add node %s: %w", spec.Name, ErrNodeExists))
			continue
		}
		spec, ip, cidr, err := spec.resolved(s.nextIndex)
		if err != nil {
			errs = append(errs, fmt.Errorf("add node: %w", err))
			continue
		}
		s.nextIndex++
		n := newNode(spec, ip, cidr)
		s.nodes[spec.Name] = n
		nodes = append(nodes, n)
	}
	s.mu.Unlock()

	work := make(chan *node)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range min(s.cfg.Workers, len(nodes)) {
		wg.Go(func() {
			for n := range work {
				if err := s.register(ctx, n); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for _, n := range nodes {
		work <- n
	}
	close(work)
	wg.Wait()
	return errors.Join(errs...)
}

// register creates or updates the Node and its status and Lease, then
// schedules the node's first heartbeat at a random point of the renew
// interval so renewals spread evenly.
func (s *Simulator) register(ctx context.Context, n *node) error {
	n.gate.RLock()
	defer n.gate.RUnlock()
	if err := s.applyNode(ctx, n); err != nil {
		s.forget(n)
		return fmt.Errorf("register node %s: %w", n.name, err)
	}
	if err := s.applyNodeStatus(ctx, n); err != nil {
		s.forget(n)
		return fmt.Errorf("register node %s: %w", n.name, err)
	}
	if err := s.renewLease(ctx, n); err != nil {
		s.forget(n)
		return fmt.Errorf("register node %s: %w", n.name, err)
	}
	s.beats.AddAfter(beat{name: n.name, gen: n.generation()}, rand.N(s.cfg.RenewInterval))
	// Pods may already be bound to this node (a re-registered node).
	s.enqueuePodsOf(n.name)
	return nil
}

// forget drops n from the simulated nodes after a failed registration.
func (s *Simulator) forget(n *node) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[n.name] == n {
		delete(s.nodes, n.name)
	}
}

// RemoveNode stops simulating name and deletes its Node and Lease. Pods bound
// to it are left to the pod garbage collector, as with a vanished kubelet.
func (s *Simulator) RemoveNode(ctx context.Context, name string) error {
	s.mu.Lock()
	n, ok := s.nodes[name]
	delete(s.nodes, name)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("remove node %s: %w", name, ErrUnknownNode)
	}
	n.gate.Lock()
	n.removed = true
	n.gen.Add(1)
	n.gate.Unlock()

	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := s.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove node %s: %w", name, err)
	}
	err := s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove node %s: delete lease: %w", name, err)
	}
	return nil
}

// Partition cuts name off: no Lease renewals, no status updates and no pod
// handling until Heal. It returns after any write in flight for the node has
// finished, so nothing is written for it afterwards.
func (s *Simulator) Partition(name string) error {
	n, ok := s.node(name)
	if !ok {
		return fmt.Errorf("partition node %s: %w", name, ErrUnknownNode)
	}
	n.gate.Lock()
	defer n.gate.Unlock()
	n.partitioned = true
	n.gen.Add(1)
	return nil
}

// Heal reconnects a partitioned node: it renews the Lease and posts
// Ready=True at once, then catches up on its pods (finishes deletions, reports
// Ready again the pods the node lifecycle controller marked not ready).
func (s *Simulator) Heal(name string) error {
	n, ok := s.node(name)
	if !ok {
		return fmt.Errorf("heal node %s: %w", name, ErrUnknownNode)
	}
	n.gate.Lock()
	if !n.partitioned {
		n.gate.Unlock()
		return nil
	}
	n.partitioned = false
	gen := n.gen.Add(1)
	n.markStatusDirty()
	n.gate.Unlock()
	s.beats.Add(beat{name: name, gen: gen})
	s.enqueuePodsOf(name)
	return nil
}

// Partitioned reports whether name is partitioned.
func (s *Simulator) Partitioned(name string) bool {
	n, ok := s.node(name)
	if !ok {
		return false
	}
	n.gate.RLock()
	defer n.gate.RUnlock()
	return n.partitioned
}

// NodeInfo describes a simulated node's addresses.
type NodeInfo struct {
	Name       string
	InternalIP netip.Addr
	PodCIDR    netip.Prefix
}

// Node returns the addresses of a simulated node.
func (s *Simulator) Node(name string) (NodeInfo, bool) {
	n, ok := s.node(name)
	if !ok {
		return NodeInfo{}, false
	}
	return NodeInfo{Name: n.name, InternalIP: n.ip, PodCIDR: n.podCIDR}, true
}

// NodeNames returns the simulated nodes, sorted.
func (s *Simulator) NodeNames() []string {
	s.mu.RLock()
	names := make([]string, 0, len(s.nodes))
	for name := range s.nodes {
		names = append(names, name)
	}
	s.mu.RUnlock()
	sort.Strings(names)
	return names
}

func (s *Simulator) node(name string) (*node, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n, ok := s.nodes[name]
	return n, ok
}

// runHeartbeats processes heartbeats until the queue shuts down.
func (s *Simulator) runHeartbeats() {
	for {
		b, shutdown := s.beats.Get()
		if shutdown {
			return
		}
		s.heartbeat(b)
		s.beats.Done(b)
	}
}

// heartbeat renews the node's Lease, posts its status when due, and
// schedules the next heartbeat. Beats of a retired chain are dropped.
func (s *Simulator) heartbeat(b beat) {
	n, ok := s.node(b.name)
	if !ok {
		return
	}
	n.gate.RLock()
	defer n.gate.RUnlock()
	if n.partitioned || n.removed || n.generation() != b.gen {
		return
	}
	next := s.cfg.RenewInterval
	if err := s.renewLease(s.ctx, n); err != nil {
		s.stats.leaseErrors.Add(1)
		s.logError("renew lease", n.name, err)
		next = min(next, 500*time.Millisecond)
	}
	if n.statusDue(s.cfg.StatusInterval) {
		if err := s.applyNodeStatus(s.ctx, n); err != nil {
			s.stats.statusErrors.Add(1)
			s.logError("post node status", n.name, err)
			n.markStatusDirty()
			next = min(next, 500*time.Millisecond)
		}
	}
	s.beats.AddAfter(b, next)
}

// onNode marks a simulated node's status for correction when its Ready
// condition is not True (the node lifecycle controller set it Unknown), as a
// kubelet would at its next status update.
func (s *Simulator) onNode(obj any) {
	node, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	n, ok := s.node(node.Name)
	if !ok {
		return
	}
	// A Node without a Ready condition is one being registered; its status
	// is on the way.
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			n.markStatusDirty()
		}
	}
}

func (s *Simulator) logError(msg, node string, err error) {
	if s.ctx.Err() != nil {
		return // shutting down
	}
	s.log.Warn(msg, "node", node, "err", err)
}

// Stats counts the simulator's writes.
type Stats struct {
	LeaseRenewals, LeaseErrors   int64
	StatusUpdates, StatusErrors  int64
	PodStatusUpdates, PodDeletes int64
	PodErrors                    int64
}

type stats struct {
	leaseRenewals, leaseErrors   atomic.Int64
	statusUpdates, statusErrors  atomic.Int64
	podStatusUpdates, podDeletes atomic.Int64
	podErrors                    atomic.Int64
}

// Stats returns the write counters so far.
func (s *Simulator) Stats() Stats {
	return Stats{
		LeaseRenewals: s.stats.leaseRenewals.Load(), LeaseErrors: s.stats.leaseErrors.Load(),
		StatusUpdates: s.stats.statusUpdates.Load(), StatusErrors: s.stats.statusErrors.Load(),
		PodStatusUpdates: s.stats.podStatusUpdates.Load(), PodDeletes: s.stats.podDeletes.Load(),
		PodErrors: s.stats.podErrors.Load(),
	}
}
