package grid

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func waitingPod(reason, msg string) corev1.Pod {
	return corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [web]"}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}}}}
}

// TestPodProblem: the most common reason wins (ties by name), pods on
// their way up and ready ones give none, pods being deleted do not count,
// the scheduler's and the Ready condition's reasons are used when no
// container says more, and a long message is cut.
func TestPodProblem(t *testing.T) {
	ready := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
	unschedulable := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending,
		Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			Message: "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}}}}
	probing := corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning,
		Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [web]"}},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	deleting := waitingPod("CrashLoopBackOff", "back-off")
	deleting.DeletionTimestamp = &metav1.Time{}
	long := make([]byte, 400)
	for i := range long {
		long[i] = 'x'
	}
	for _, tc := range []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"none", nil, ""},
		{"ready", []corev1.Pod{ready}, ""},
		{"starting", []corev1.Pod{waitingPod("ContainerCreating", "")}, ""},
		{"pull", []corev1.Pod{ready, waitingPod("ImagePullBackOff", `Back-off pulling image "reg/web:v2"`), waitingPod("ErrImagePull", "not found"), waitingPod("ImagePullBackOff", "other")},
			`2/4 pods ImagePullBackOff: Back-off pulling image "reg/web:v2"`},
		{"tie by name", []corev1.Pod{waitingPod("ErrImagePull", "a"), waitingPod("CrashLoopBackOff", "b")}, "1/2 pods CrashLoopBackOff: b"},
		{"deleting", []corev1.Pod{deleting, ready}, ""},
		{"unschedulable", []corev1.Pod{unschedulable}, "1/1 pods Unschedulable: 0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."},
		{"readiness probe", []corev1.Pod{probing}, "1/1 pods ContainersNotReady: containers with unready status: [web]"},
		{"long", []corev1.Pod{waitingPod("CreateContainerConfigError", string(long))}, "1/1 pods CreateContainerConfigError: " + string(long[:maxProblemMessage]) + "…"},
	} {
		if got := podProblem(tc.pods); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestPodProblemIsStableWhileStuck: every state the kubelet cycles a stuck
// container through gives the same problem (so a unit that stays broken
// is not rewritten at each retry), and the message quoted is the first
// pod's by name whatever order the cache lists them in.
func TestPodProblemIsStableWhileStuck(t *testing.T) {
	const pullErr = `failed to pull and unpack image "reg/web:v2": failed to resolve image: reg/web:v2: not found`
	pull := [][]corev1.Pod{
		{waitingPod("ErrImagePull", pullErr)},
		{waitingPod("ImagePullBackOff", `Back-off pulling image "reg/web:v2": ErrImagePull: `+pullErr)},
	}
	lastExit := &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error"}
	crashLooping := func(backOff string) corev1.Pod {
		p := waitingPod("CrashLoopBackOff", "back-off "+backOff+" restarting failed container=web pod=web-a-1_default(0a1b)")
		p.Status.ContainerStatuses[0].RestartCount = 3
		p.Status.ContainerStatuses[0].LastTerminationState.Terminated = lastExit
		return p
	}
	running := waitingPod("", "")
	running.Status.Phase = corev1.PodRunning
	running.Status.ContainerStatuses[0] = corev1.ContainerStatus{Name: "web", RestartCount: 4,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, LastTerminationState: corev1.ContainerState{Terminated: lastExit}}
	exitedNow := waitingPod("", "")
	exitedNow.Status.ContainerStatuses[0] = corev1.ContainerStatus{Name: "web", RestartCount: 4,
		State: corev1.ContainerState{Terminated: lastExit}}
	crash := [][]corev1.Pod{{crashLooping("10s")}, {crashLooping("5m0s")}, {running}, {exitedNow}}
	for name, tc := range map[string]struct {
		states [][]corev1.Pod
		want   string
	}{
		"image pull": {pull, "1/1 pods ErrImagePull: " + pullErr},
		"crash loop": {crash, "1/1 pods CrashLoopBackOff: exit code 1 (Error)"},
	} {
		for i, pods := range tc.states {
			if got := podProblem(pods); got != tc.want {
				t.Errorf("%s, state %d: %q, want %q", name, i, got, tc.want)
			}
		}
	}
	if got, want := podProblem([]corev1.Pod{waitingPod("ImagePullBackOff", `Back-off pulling image "reg/web:v2"`)}),
		`1/1 pods ImagePullBackOff: Back-off pulling image "reg/web:v2"`; got != want {
		t.Errorf("a back-off that quotes no error: %q, want %q", got, want)
	}

	a, b := waitingPod("ErrImagePull", "a's message"), waitingPod("ErrImagePull", "b's message")
	a.Name, b.Name = "web-a-1", "web-a-2"
	for _, pods := range [][]corev1.Pod{{a, b}, {b, a}} {
		if got, want := podProblem(pods), "2/2 pods ErrImagePull: a's message"; got != want {
			t.Errorf("pods %s, %s: %q, want %q", pods[0].Name, pods[1].Name, got, want)
		}
	}
}
