package grid

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// waitingAsUsual are the waiting reasons of a container on its way up.
var waitingAsUsual = map[string]bool{"ContainerCreating": true, "PodInitializing": true}

// maxProblemMessage bounds the message a unit's problem quotes.
const maxProblemMessage = 240

// The kubelet's waiting reasons for a container in back-off.
const (
	reasonPullBackOff = "ImagePullBackOff"
	reasonCrashLoop   = "CrashLoopBackOff"
)

// pullBackOff is the reason and message of the pull error behind an
// ImagePullBackOff, which the kubelet quotes as `Back-off pulling image
// "IMAGE": REASON: MESSAGE` (ErrImagePull, RegistryUnavailable, …): the
// same the pull's failure itself showed.
func pullBackOff(msg string) (reason, message string) {
	rest, ok := strings.CutPrefix(msg, `Back-off pulling image "`)
	if !ok {
		return reasonPullBackOff, msg
	}
	_, rest, ok = strings.Cut(rest, `": `)
	if !ok {
		return reasonPullBackOff, msg
	}
	r, m, ok := strings.Cut(rest, ": ")
	if !ok || r == "" || strings.ContainsAny(r, " \"") {
		return reasonPullBackOff, msg
	}
	return r, m
}

// exited describes a container's last exit, or says fallback when the
// kubelet does not report it.
func exited(t *corev1.ContainerStateTerminated, fallback string) string {
	if t == nil {
		return fallback
	}
	out := fmt.Sprintf("exit code %d", t.ExitCode)
	if t.Reason != "" {
		out += " (" + t.Reason + ")"
	}
	if t.Message != "" {
		out += ": " + t.Message
	}
	return out
}

// podReason is why pod is not ready, as its containers, the scheduler or
// the kubelet say it: a container's waiting reason (an image that cannot
// be pulled, a crash loop, a configuration error), the scheduler's
// (Unschedulable), a failed pod's (Evicted), else the Ready condition's
// (ContainersNotReady: a readiness probe). Empty for a ready pod, or one
// on its way up.
//
// The kubelet rewrites a stuck container's state on every retry: an image
// pull alternates between the pull's error and ImagePullBackOff, a crash
// loop between running, terminated and CrashLoopBackOff with a growing
// back-off. Each is given one reason and message for all of its states
// (the pull's error; CrashLoopBackOff with the last exit), so a unit that
// stays broken keeps one problem and its status is not rewritten.
func podReason(p *corev1.Pod) (reason, message string) {
	var ready *corev1.PodCondition
	for i, c := range p.Status.Conditions {
		switch c.Type {
		case corev1.PodScheduled:
			if c.Status == corev1.ConditionFalse && c.Reason != "" {
				return c.Reason, c.Message
			}
		case corev1.PodReady:
			ready = &p.Status.Conditions[i]
		}
	}
	if ready != nil && ready.Status == corev1.ConditionTrue {
		return "", ""
	}
	if p.Status.Phase == corev1.PodFailed && p.Status.Reason != "" {
		return p.Status.Reason, p.Status.Message
	}
	for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && !waitingAsUsual[w.Reason] {
			switch w.Reason {
			case reasonPullBackOff:
				return pullBackOff(w.Message)
			case reasonCrashLoop:
				return reasonCrashLoop, exited(cs.LastTerminationState.Terminated, w.Message)
			}
			return w.Reason, w.Message
		}
		if t := cs.State.Terminated; t != nil && t.ExitCode != 0 {
			return reasonCrashLoop, exited(t, "")
		}
		if t := cs.LastTerminationState.Terminated; !cs.Ready && cs.RestartCount > 0 && t != nil && t.ExitCode != 0 {
			return reasonCrashLoop, exited(t, "")
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting != nil {
			return "", "" // still starting
		}
	}
	if ready != nil && ready.Reason != "" {
		return ready.Reason, ready.Message
	}
	return "", ""
}

// podProblem summarizes why pods are not all ready: the most common
// reason among them (ties: by name), how many of the pods give it and one
// of their messages (the first pod's by name: the cache lists pods in no
// fixed order), e.g. `2/3 pods ErrImagePull: failed to pull and unpack
// image "reg/web:v2": not found`. Empty when no pod gives a reason. Pods
// being deleted do not count.
func podProblem(pods []corev1.Pod) string {
	type seen struct {
		n        int
		pod, msg string // the message of the first pod by name
	}
	reasons := map[string]*seen{}
	total := 0
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp != nil {
			continue
		}
		total++
		r, msg := podReason(p)
		if r == "" {
			continue
		}
		if reasons[r] == nil {
			reasons[r] = &seen{pod: p.Name, msg: msg}
		} else if p.Name < reasons[r].pod {
			reasons[r].pod, reasons[r].msg = p.Name, msg
		}
		reasons[r].n++
	}
	if len(reasons) == 0 {
		return ""
	}
	names := slices.SortedFunc(maps.Keys(reasons), func(a, b string) int {
		return cmp.Or(cmp.Compare(reasons[b].n, reasons[a].n), strings.Compare(a, b))
	})
	top := reasons[names[0]]
	msg := strings.Join(strings.Fields(top.msg), " ")
	if len(msg) > maxProblemMessage {
		msg = strings.ToValidUTF8(msg[:maxProblemMessage], "") + "…"
	}
	out := fmt.Sprintf("%d/%d pods %s", top.n, total, names[0])
	if msg != "" {
		out += ": " + msg
	}
	return out
}

// unitPods lists the pods of grid g's child in unit (the grid's labels,
// and the child's name before their own suffix).
func unitPods(ctx context.Context, c client.Reader, g client.Object, unit, child string) ([]corev1.Pod, error) {
	var list corev1.PodList
	if err := c.List(ctx, &list, client.InNamespace(g.GetNamespace()),
		client.MatchingLabels{wellknown.LabelGrid: g.GetName(), wellknown.LabelGridUnit: unit}); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return !strings.HasPrefix(p.Name, child+"-") }), nil
}
