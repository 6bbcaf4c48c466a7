package edgesim

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

func indexPodByNode(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName == "" {
		return nil, nil
	}
	return []string{pod.Spec.NodeName}, nil
}

// onPod queues a pod bound to a simulated node.
func (s *Simulator) onPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if _, ok := s.node(pod.Spec.NodeName); !ok {
		return
	}
	key, err := cache.MetaNamespaceKeyFunc(pod)
	if err == nil {
		s.pods.Add(key)
	}
}

// onPodDelete returns a deleted pod's IP to its node's pool.
func (s *Simulator) onPodDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	if n, ok := s.node(pod.Spec.NodeName); ok {
		n.releasePodIP(pod.UID)
	}
}

// enqueuePodsOf queues every pod bound to node name.
func (s *Simulator) enqueuePodsOf(name string) {
	objs, err := s.podInformer.GetIndexer().ByIndex(podsByNode, name)
	if err != nil {
		return
	}
	for _, obj := range objs {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			s.pods.Add(key)
		}
	}
}

// runPods processes pod keys until the queue shuts down.
func (s *Simulator) runPods() {
	for {
		key, shutdown := s.pods.Get()
		if shutdown {
			return
		}
		if err := s.syncPod(s.ctx, key); err != nil {
			s.stats.podErrors.Add(1)
			if s.ctx.Err() == nil {
				s.log.Warn("sync pod", "pod", key, "err", err)
			}
			s.pods.AddRateLimited(key)
		} else {
			s.pods.Forget(key)
		}
		s.pods.Done(key)
	}
}

// syncPod acts as the kubelet of the pod's node: it finishes the deletion of
// a terminating pod and reports any other non-terminal pod Running and Ready.
// Pods of partitioned nodes are left alone; Heal queues them again.
func (s *Simulator) syncPod(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := s.podLister.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	n, ok := s.node(pod.Spec.NodeName)
	if !ok {
		return nil
	}
	n.gate.RLock()
	defer n.gate.RUnlock()
	if n.partitioned || n.removed {
		return nil
	}

	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if pod.DeletionTimestamp != nil {
		err := s.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      &metav1.Preconditions{UID: ptr.To(pod.UID)},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod: %w", err)
		}
		s.stats.podDeletes.Add(1)
		n.releasePodIP(pod.UID)
		return nil
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	podIP, err := n.podIP(pod)
	if err != nil {
		return err
	}
	if runningAndReady(pod, n.ip, podIP) {
		return nil
	}
	_, err = s.client.CoreV1().Pods(ns).ApplyStatus(ctx, runningStatus(pod, n.ip, podIP),
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("apply pod status: %w", err)
	}
	s.stats.podStatusUpdates.Add(1)
	return nil
}

// podIP returns the pod's IP: the node IP for host-network pods, else the
// address it already reports or the next free one of the node's pod CIDR.
func (n *node) podIP(pod *corev1.Pod) (netip.Addr, error) {
	if pod.Spec.HostNetwork {
		return n.ip, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ip, ok := n.podIPs[pod.UID]; ok {
		return ip, nil
	}
	if ip, err := netip.ParseAddr(pod.Status.PodIP); err == nil && n.pool.claim(ip) {
		n.podIPs[pod.UID] = ip
		return ip, nil
	}
	ip, err := n.pool.next()
	if err != nil {
		return ip, fmt.Errorf("pod %s/%s on %s: %w", pod.Namespace, pod.Name, n.name, err)
	}
	n.podIPs[pod.UID] = ip
	return ip, nil
}

func (n *node) releasePodIP(uid types.UID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ip, ok := n.podIPs[uid]; ok {
		n.pool.release(ip)
		delete(n.podIPs, uid)
	}
}

// readyConditions are the pod conditions a kubelet sets True for a running
// pod whose containers are all ready.
var readyConditions = []corev1.PodConditionType{
	corev1.PodReadyToStartContainers,
	corev1.PodInitialized,
	corev1.ContainersReady,
	corev1.PodReady,
	corev1.PodScheduled,
}

// runningAndReady reports whether the pod already shows what runningStatus
// would write, so nothing needs writing.
func runningAndReady(pod *corev1.Pod, hostIP, podIP netip.Addr) bool {
	st := pod.Status
	if st.Phase != corev1.PodRunning || st.HostIP != hostIP.String() || st.PodIP != podIP.String() ||
		len(st.ContainerStatuses) != len(pod.Spec.Containers) {
		return false
	}
	for _, t := range readyConditions {
		if conditionStatus(pod, t) != corev1.ConditionTrue {
			return false
		}
	}
	for _, cs := range st.ContainerStatuses {
		if !cs.Ready {
			return false
		}
	}
	return true
}

func conditionStatus(pod *corev1.Pod, t corev1.PodConditionType) corev1.ConditionStatus {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// runningStatus is the status of pod running on a node at hostIP: phase
// Running, all ready conditions True, init containers completed and
// containers running and ready. Conditions already True keep their
// transition time.
func runningStatus(pod *corev1.Pod, hostIP, podIP netip.Addr) *corev1ac.PodApplyConfiguration {
	now := metav1.Now()
	started := now
	if pod.Status.StartTime != nil {
		started = *pod.Status.StartTime
	}
	status := corev1ac.PodStatus().
		WithObservedGeneration(pod.Generation).
		WithPhase(corev1.PodRunning).
		WithHostIP(hostIP.String()).WithHostIPs(corev1ac.HostIP().WithIP(hostIP.String())).
		WithPodIP(podIP.String()).WithPodIPs(corev1ac.PodIP().WithIP(podIP.String())).
		WithStartTime(started)
	for _, t := range readyConditions {
		since := now
		for _, c := range pod.Status.Conditions {
			if c.Type == t && c.Status == corev1.ConditionTrue {
				since = c.LastTransitionTime
			}
		}
		status.WithConditions(corev1ac.PodCondition().WithType(t).WithStatus(corev1.ConditionTrue).
			WithObservedGeneration(pod.Generation).WithLastTransitionTime(since))
	}
	for _, c := range pod.Spec.InitContainers {
		cs := containerStatus(pod, c).WithReady(false).WithStarted(false)
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			// A sidecar keeps running next to the main containers.
			cs.WithReady(true).WithStarted(true).
				WithState(corev1ac.ContainerState().WithRunning(corev1ac.ContainerStateRunning().WithStartedAt(started)))
		} else {
			cs.WithState(corev1ac.ContainerState().WithTerminated(corev1ac.ContainerStateTerminated().
				WithExitCode(0).WithReason("Completed").WithStartedAt(started).WithFinishedAt(started)))
		}
		status.WithInitContainerStatuses(cs)
	}
	for _, c := range pod.Spec.Containers {
		status.WithContainerStatuses(containerStatus(pod, c).WithReady(true).WithStarted(true).
			WithState(corev1ac.ContainerState().WithRunning(corev1ac.ContainerStateRunning().WithStartedAt(started))))
	}
	return corev1ac.Pod(pod.Name, pod.Namespace).WithStatus(status)
}

func containerStatus(pod *corev1.Pod, c corev1.Container) *corev1ac.ContainerStatusApplyConfiguration {
	return corev1ac.ContainerStatus().
		WithName(c.Name).
		WithImage(c.Image).
		WithImageID("edgesim://" + c.Image).
		WithContainerID(fmt.Sprintf("edgesim://%s/%s", pod.UID, c.Name)).
		WithRestartCount(0)
}
