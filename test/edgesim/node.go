package edgesim

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/utils/ptr"
)

// node is the state of one simulated node.
type node struct {
	name    string
	spec    NodeSpec
	ip      netip.Addr
	podCIDR netip.Prefix

	// gate is held shared by every write made for the node and exclusively
	// by Partition, Heal and RemoveNode, so those wait for writes in flight.
	gate        sync.RWMutex
	partitioned bool // guarded by gate
	removed     bool // guarded by gate
	gen         atomic.Uint64

	mu          sync.Mutex // guards the fields below
	uid         types.UID
	lease       *coordinationv1.Lease
	lastStatus  time.Time
	statusDirty bool
	pool        *ipPool
	podIPs      map[types.UID]netip.Addr
}

func newNode(spec NodeSpec, ip netip.Addr, cidr netip.Prefix) *node {
	return &node{
		name: spec.Name, spec: spec, ip: ip, podCIDR: cidr,
		pool: newIPPool(cidr), podIPs: map[types.UID]netip.Addr{},
	}
}

func (n *node) generation() uint64 { return n.gen.Load() }

func (n *node) markStatusDirty() {
	n.mu.Lock()
	n.statusDirty = true
	n.mu.Unlock()
}

// statusDue reports whether the node should post its status now.
func (n *node) statusDue(interval time.Duration) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.statusDirty || time.Since(n.lastStatus) >= interval
}

// applyNode creates or updates the Node object: labels, pod CIDR, taints.
func (s *Simulator) applyNode(ctx context.Context, n *node) error {
	labels := map[string]string{
		corev1.LabelHostname:   n.name,
		corev1.LabelOSStable:   "linux",
		corev1.LabelArchStable: "amd64",
	}
	maps.Copy(labels, n.spec.Labels)
	spec := corev1ac.NodeSpec().WithPodCIDR(n.spec.PodCIDR).WithPodCIDRs(n.spec.PodCIDR)
	for _, t := range n.spec.Taints {
		spec.WithTaints(corev1ac.Taint().WithKey(t.Key).WithValue(t.Value).WithEffect(t.Effect))
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	obj, err := s.client.CoreV1().Nodes().Apply(ctx,
		corev1ac.Node(n.name).WithLabels(labels).WithSpec(spec),
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("apply node: %w", err)
	}
	n.mu.Lock()
	n.uid = obj.UID
	n.mu.Unlock()
	return nil
}

// applyNodeStatus posts the node's full status: addresses, capacity, Ready
// and the pressure conditions with a fresh heartbeat. A condition keeps its
// transition time while its status is unchanged.
func (s *Simulator) applyNodeStatus(ctx context.Context, n *node) error {
	now := metav1.Now()
	current := map[corev1.NodeConditionType]corev1.NodeCondition{}
	if obj, err := s.nodeLister.Get(n.name); err == nil {
		for _, c := range obj.Status.Conditions {
			current[c.Type] = c
		}
	}
	cond := func(t corev1.NodeConditionType, status corev1.ConditionStatus, reason, msg string) *corev1ac.NodeConditionApplyConfiguration {
		since := now
		if c, ok := current[t]; ok && c.Status == status {
			since = c.LastTransitionTime
		}
		return corev1ac.NodeCondition().WithType(t).WithStatus(status).WithReason(reason).WithMessage(msg).
			WithLastHeartbeatTime(now).WithLastTransitionTime(since)
	}
	resources := corev1.ResourceList{
		corev1.ResourceCPU:    n.spec.CPU,
		corev1.ResourceMemory: n.spec.Memory,
		corev1.ResourcePods:   n.spec.Pods,
	}
	status := corev1ac.NodeStatus().
		WithCapacity(resources).
		WithAllocatable(resources).
		WithAddresses(
			corev1ac.NodeAddress().WithType(corev1.NodeInternalIP).WithAddress(n.spec.InternalIP),
			corev1ac.NodeAddress().WithType(corev1.NodeHostName).WithAddress(n.name)).
		WithConditions(
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status")).
		WithDaemonEndpoints(corev1ac.NodeDaemonEndpoints().WithKubeletEndpoint(corev1ac.DaemonEndpoint().WithPort(10250))).
		WithNodeInfo(corev1ac.NodeSystemInfo().
			WithMachineID(n.name).WithSystemUUID(n.name).WithBootID(n.name).
			WithKernelVersion("6.1.0-edgesim").WithOSImage("edgesim").
			WithContainerRuntimeVersion("edgesim://1.0.0").
			WithKubeletVersion(KubeletVersion).
			WithOperatingSystem("linux").WithArchitecture("amd64"))

	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := s.client.CoreV1().Nodes().ApplyStatus(ctx, corev1ac.Node(n.name).WithStatus(status),
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("apply node status: %w", err)
	}
	s.stats.statusUpdates.Add(1)
	n.mu.Lock()
	n.lastStatus = now.Time
	n.statusDirty = false
	n.mu.Unlock()
	return nil
}

// renewLease sets the node Lease's renewTime to now, creating the Lease
// (owned by the Node, as a kubelet does) when it is missing. It updates the
// cached Lease and re-reads it only on a conflict.
func (s *Simulator) renewLease(ctx context.Context, n *node) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	leases := s.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)

	n.mu.Lock()
	cached, uid := n.lease, n.uid
	n.mu.Unlock()

	for attempt := 0; ; attempt++ {
		if cached == nil {
			got, err := leases.Get(ctx, n.name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				got, err = leases.Create(ctx, s.newLease(n, uid), metav1.CreateOptions{})
				if err == nil {
					s.storeLease(n, got)
					s.stats.leaseRenewals.Add(1)
					return nil
				}
				if !apierrors.IsAlreadyExists(err) || attempt > 2 {
					return fmt.Errorf("create lease: %w", err)
				}
				continue
			case err != nil:
				return fmt.Errorf("get lease: %w", err)
			}
			cached = got
		}
		lease := cached.DeepCopy()
		lease.Spec.HolderIdentity = ptr.To(n.name)
		lease.Spec.LeaseDurationSeconds = ptr.To(int32(s.cfg.LeaseDuration / time.Second))
		lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
		got, err := leases.Update(ctx, lease, metav1.UpdateOptions{FieldManager: FieldManager})
		if err == nil {
			s.storeLease(n, got)
			s.stats.leaseRenewals.Add(1)
			return nil
		}
		if (!apierrors.IsConflict(err) && !apierrors.IsNotFound(err)) || attempt > 2 {
			s.storeLease(n, nil)
			return fmt.Errorf("update lease: %w", err)
		}
		cached = nil // re-read (conflict) or re-create (deleted)
	}
}

func (s *Simulator) newLease(n *node, uid types.UID) *coordinationv1.Lease {
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: n.name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(n.name),
			LeaseDurationSeconds: ptr.To(int32(s.cfg.LeaseDuration / time.Second)),
			RenewTime:            ptr.To(metav1.NewMicroTime(time.Now())),
		},
	}
	if uid != "" {
		lease.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Node", Name: n.name, UID: uid,
		}}
	}
	return lease
}

func (s *Simulator) storeLease(n *node, lease *coordinationv1.Lease) {
	n.mu.Lock()
	n.lease = lease
	n.mu.Unlock()
}
