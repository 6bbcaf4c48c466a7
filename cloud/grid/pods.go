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

// podReason is why pod is not ready, as its containers, the scheduler or
// the kubelet say it: a container's waiting reason (an image that cannot
// be pulled, a crash loop, a configuration error), the scheduler's
// (Unschedulable), a failed pod's (Evicted), else the Ready condition's
// (ContainersNotReady: a readiness probe). Empty for a ready pod, or one
// on its way up.
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
			return w.Reason, w.Message
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
// of their messages, e.g. `2/3 pods ImagePullBackOff: Back-off pulling
// image "reg/web:v2"`. Empty when no pod gives a reason. Pods being
// deleted do not count.
func podProblem(pods []corev1.Pod) string {
	type seen struct {
		n   int
		msg string
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
			reasons[r] = &seen{msg: msg}
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
