package grid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// ownerIndex indexes children by the name of their controlling grid.
const ownerIndex = "apps.atoll.io/controller"

// gridKind is one grid kind and its child kind, for the generic
// reconciler.
type gridKind[S any] struct {
	kindOf[S]
	// GridKind is the grid's kind (DeploymentGrid, StatefulSetGrid).
	GridKind    string
	NewGrid     func() client.Object
	NewGridList func() client.ObjectList
	GridItems   func(client.ObjectList) []client.Object
	// Spec reads a grid: its rendering spec (key defaulted to def), its
	// rollout and its status.
	Spec   func(g client.Object, def string) (spec[S], *appsv1alpha1.Rollout)
	Status func(g client.Object) *appsv1alpha1.GridStatus
	// Revision hashes what the children depend on (all but rollout).
	Revision     func(g client.Object) (string, error)
	NewChild     func() client.Object
	NewChildList func() client.ObjectList
	Items        func(client.ObjectList) []client.Object
	// Observe reads a child's status into a UnitStatus (Ready included).
	Observe func(c client.Object, u *appsv1alpha1.UnitStatus)
	// Completed reports whether a child finished rolling out its spec, as
	// its workload controller reports it.
	Completed func(c client.Object) bool
}

// reconciler runs one grid kind.
type reconciler[S any] struct {
	k       gridKind[S]
	c       client.Client
	cfg     Config
	log     *slog.Logger
	rec     record.EventRecorder
	metrics *metrics
	now     func() time.Time

	mu sync.Mutex
	// applied is the generation each child had after this process
	// applied it: a child whose generation moved on with the same
	// revision was changed by hand and is applied again. Empty after a
	// restart or a term of leadership ends, which then trusts the
	// revision annotation (no writes).
	applied map[types.UID]int64
	// blocked maps the key of an object that holds a child's name
	// without being the grid's to the grid's key.
	blocked sync.Map
	warned  warnings
	// wrote is the last status this process wrote to each grid (by
	// name), and the resource version it wrote over: a reconcile that
	// runs before the cache holds that write (a child's event queued
	// meanwhile) finds the grid as it was, and goes on from the status
	// written instead of writing it again.
	wrote sync.Map // types.NamespacedName → statusWrite
}

// statusWrite is a status written over the grid at resource version
// before.
type statusWrite struct {
	before string
	status *appsv1alpha1.GridStatus
}

// orphanRequests maps a child event to its grid: an orphan labeled for a
// grid (to adopt), or an object that blocked a grid's child name.
func (r *reconciler[S]) orphanRequests(_ context.Context, o client.Object) []reconcile.Request {
	var out []reconcile.Request
	if g, ok := r.blocked.Load(client.ObjectKeyFromObject(o)); ok {
		out = append(out, reconcile.Request{NamespacedName: g.(types.NamespacedName)})
	}
	if g := o.GetLabels()[wellknown.LabelGrid]; g != "" && metav1.GetControllerOf(o) == nil {
		out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: g}})
	}
	return out
}

func (r *reconciler[S]) gvk() schema.GroupVersionKind {
	return appsv1alpha1.GroupVersion.WithKind(r.k.GridKind)
}

// Reconcile brings one grid's children and status in line with its spec
// and the units. Invalid specs end in a condition and an Event, not a
// retry; transient errors requeue with backoff.
func (r *reconciler[S]) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	g := r.k.NewGrid()
	if err := r.c.Get(ctx, req.NamespacedName, g); err != nil {
		if apierrors.IsNotFound(err) {
			r.wrote.Delete(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if g.GetDeletionTimestamp() != nil {
		return reconcile.Result{}, nil // the garbage collector takes the children
	}
	now := r.now()
	s, rollout := r.k.Spec(g, r.cfg.UnitLabel)
	units, err := unitsOf(ctx, r.c, s.Key)
	if err != nil {
		return reconcile.Result{}, err
	}
	nodeUnits, err := r.nodeUnitLabels(ctx, s.Key)
	if err != nil {
		return reconcile.Result{}, err
	}
	owner := *metav1.NewControllerRef(g, r.gvk())
	var problems []string
	desired := map[string]child{}
	for _, u := range slices.Sorted(maps.Keys(units)) {
		ch, err := render(r.k.kindOf, g, owner, s, u, nodeUnits[u])
		if errors.Is(err, ErrInvalid) {
			problems = append(problems, strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
			continue
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		desired[u] = ch
	}

	children, err := r.children(ctx, g)
	if err != nil {
		return reconcile.Result{}, err
	}
	var errs []error
	current := map[string]client.Object{} // by unit: children this grid controls or adopts
	for _, c := range children {
		ref := metav1.GetControllerOf(c)
		ours := ref != nil && ref.UID == g.GetUID()
		unit := c.GetLabels()[wellknown.LabelGridUnit]
		belongs := c.GetLabels()[wellknown.LabelGrid] == g.GetName() && unit != "" && c.GetName() == ChildName(g.GetName(), unit)
		switch {
		case ours && !belongs:
			// Relabeled by hand: no longer this grid's.
			errs = append(errs, r.release(ctx, g, c))
		case !belongs:
		case ref != nil && !ours:
			problems = append(problems, fmt.Sprintf("unit %s: %s %s is controlled by %s %s", unit, r.k.Kind, c.GetName(), ref.Kind, ref.Name))
			delete(desired, unit)
		case units[unit] == 0 && ours:
			errs = append(errs, r.delete(ctx, c))
		case units[unit] == 0:
			// An orphan of a unit that is gone: not ours to delete.
		default:
			current[unit] = c // ours, or an orphan to adopt
		}
	}

	// A missing child's name may be taken by an object that is not this
	// grid's (say, one released above): never overwrite it.
	for _, u := range slices.Sorted(maps.Keys(desired)) {
		if _, ok := current[u]; ok {
			continue
		}
		o := r.k.NewChild()
		err := r.c.Get(ctx, client.ObjectKey{Namespace: g.GetNamespace(), Name: desired[u].Name}, o)
		switch {
		case err == nil:
			problems = append(problems, fmt.Sprintf("unit %s: %s %s exists and is not labeled for this grid", u, r.k.Kind, o.GetName()))
			delete(desired, u)
			// Its deletion or relabeling enqueues this grid.
			r.blocked.Store(client.ObjectKeyFromObject(o), client.ObjectKeyFromObject(g))
		case !apierrors.IsNotFound(err):
			return reconcile.Result{}, err
		}
	}

	// The rollout: which units move to their desired revision now.
	st := r.k.Status(g)
	if w, ok := r.wrote.Load(req.NamespacedName); ok && w.(statusWrite).before == g.GetResourceVersion() {
		// The cache does not hold this process's last status write yet:
		// go on from what it wrote.
		st = w.(statusWrite).status.DeepCopy()
	}
	rev, err := r.k.Revision(g)
	if err != nil {
		return reconcile.Result{}, err
	}
	var states []unitState
	unitStatus := map[string]*appsv1alpha1.UnitStatus{}
	for _, u := range slices.Sorted(maps.Keys(desired)) {
		us := &appsv1alpha1.UnitStatus{Name: u, Child: desired[u].Name}
		unitStatus[u] = us
		state := unitState{Unit: u, Desired: desired[u].Revision}
		if c, ok := current[u]; ok {
			r.k.Observe(c, us)
			us.Revision = c.GetAnnotations()[wellknown.AnnotationGridRevision]
			state.Current, state.Ready, state.Done = us.Revision, us.Ready, r.k.Completed(c)
			state.Since, _ = time.Parse(time.RFC3339, c.GetAnnotations()[wellknown.AnnotationGridRevisionSince])
			if state.Current == "" {
				state.Current = "unknown" // an orphan: adopted through the rollout
			}
		}
		states = append(states, state)
	}
	p := planRollout(states, rollout, st.Rollout, rev, now)
	apply := map[string]bool{}
	for _, u := range p.Apply {
		apply[u] = true
	}
	for u, c := range current {
		ch, ok := desired[u]
		if !ok || apply[u] || c.GetAnnotations()[wellknown.AnnotationGridRevision] != ch.Revision {
			continue
		}
		// Same revision: apply only to adopt, or to undo a hand edit.
		ref := metav1.GetControllerOf(c)
		if ref == nil || ref.UID != g.GetUID() || r.edited(c) {
			apply[u] = true
		}
	}
	for _, u := range slices.Sorted(maps.Keys(apply)) {
		since := now
		if c, ok := current[u]; ok && c.GetAnnotations()[wellknown.AnnotationGridRevision] == desired[u].Revision {
			since, _ = time.Parse(time.RFC3339, c.GetAnnotations()[wellknown.AnnotationGridRevisionSince])
		}
		obj, err := r.apply(ctx, desired[u], since)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		r.k.Observe(obj, unitStatus[u])
		unitStatus[u].Revision = desired[u].Revision
	}
	// The units the rollout moved now are updating from now on, as the
	// next reconcile will find them: the status says so at once, not in
	// a second write.
	for _, u := range p.Apply {
		if us := unitStatus[u]; us != nil && us.Revision == desired[u].Revision && !us.Ready && !slices.Contains(p.Updating, u) {
			p.Updating = append(p.Updating, u)
		}
	}

	// Why the units that are not ready are not: their pods say (and their
	// changes bring the grid back: podEvents).
	for _, u := range slices.Sorted(maps.Keys(unitStatus)) {
		us := unitStatus[u]
		if us.Ready {
			continue
		}
		pods, err := unitPods(ctx, r.c, g, u, us.Child)
		if err != nil {
			r.log.Debug("cannot list a unit's pods", "grid", req.NamespacedName, "unit", u, "err", err)
			continue
		}
		us.Problem = podProblem(pods)
	}

	// Status, written only when it changed.
	next := st.DeepCopy()
	next.ObservedGeneration = g.GetGeneration()
	next.Units = nil
	next.ReadyUnits = 0
	for _, u := range slices.Sorted(maps.Keys(unitStatus)) {
		us := unitStatus[u]
		if us.Ready && us.Revision == desired[u].Revision {
			next.ReadyUnits++
		}
		next.Units = append(next.Units, *us)
	}
	next.UnitCount = int32(len(units))
	p.Status.Updated = nil
	for _, us := range next.Units {
		if us.Revision == desired[us.Name].Revision {
			p.Status.Updated = append(p.Status.Updated, us.Name)
		}
	}
	next.Rollout = &p.Status
	r.conditions(g, next, problems, p, len(units))
	if !equality.Semantic.DeepEqual(st, next) {
		if err := r.writeStatus(ctx, g, next); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	res := reconcile.Result{RequeueAfter: r.cfg.Resync}
	if p.RequeueAfter > 0 && (res.RequeueAfter == 0 || p.RequeueAfter+time.Second < res.RequeueAfter) {
		res.RequeueAfter = p.RequeueAfter + time.Second
	}
	return res, nil
}

// conditions sets Ready, Progressing and InvalidSpec on next, and records
// an Event on each transition to a bad state.
func (r *reconciler[S]) conditions(g client.Object, next *appsv1alpha1.GridStatus, problems []string, p plan, units int) {
	gen := g.GetGeneration()
	if len(problems) > 0 {
		msg := strings.Join(problems, "; ")
		c := meta.FindStatusCondition(next.Conditions, appsv1alpha1.ConditionInvalid)
		if fresh := r.warned.first(g.GetUID(), msg); fresh && (c == nil || c.Status != metav1.ConditionTrue || c.Message != msg) {
			r.rec.Event(g, corev1.EventTypeWarning, "InvalidSpec", msg)
			r.metrics.invalid.WithLabelValues(r.k.GridKind).Inc()
		}
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionInvalid, Status: metav1.ConditionTrue, Reason: "InvalidSpec", Message: msg, ObservedGeneration: gen})
	} else {
		r.warned.clear(g.GetUID())
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionInvalid, Status: metav1.ConditionFalse, Reason: "Valid", ObservedGeneration: gen})
	}
	switch {
	case len(p.Stalled) > 0:
		msg := fmt.Sprintf("units %s not Ready within their progress deadline; the rollout stopped (resume: atoll grid resume %s)", strings.Join(p.Stalled, ", "), g.GetName())
		if c := meta.FindStatusCondition(next.Conditions, appsv1alpha1.ConditionProgressing); c == nil || c.Status != metav1.ConditionFalse {
			r.rec.Event(g, corev1.EventTypeWarning, "ProgressDeadlineExceeded", msg)
			r.metrics.stalls.WithLabelValues(r.k.GridKind).Inc()
		}
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: "ProgressDeadlineExceeded", Message: msg, ObservedGeneration: gen})
	case len(p.Pending) > 0 || len(p.Updating) > 0 || len(p.Apply) > 0:
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: "RollingOut", Message: fmt.Sprintf("%d units updating, %d pending", len(p.Updating), len(p.Pending)), ObservedGeneration: gen})
	default:
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionProgressing, Status: metav1.ConditionTrue, Reason: "Complete", Message: "every unit has the current revision", ObservedGeneration: gen})
	}
	if p.Resumed {
		r.rec.Event(g, corev1.EventTypeNormal, "RolloutResumed", "the rollout passes the stalled units")
	}
	var why []string
	for _, us := range next.Units {
		if us.Problem != "" && len(why) < 3 {
			why = append(why, "unit "+us.Name+": "+us.Problem)
		}
	}
	if int(next.ReadyUnits) == units && len(problems) == 0 {
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "AllUnitsReady", Message: fmt.Sprintf("%d/%d units ready", next.ReadyUnits, units), ObservedGeneration: gen})
	} else {
		msg := fmt.Sprintf("%d/%d units ready", next.ReadyUnits, units)
		if len(why) > 0 {
			msg += "; " + strings.Join(why, "; ")
		}
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "UnitsNotReady", Message: msg, ObservedGeneration: gen})
	}
}

// children lists the children labeled for g or controlled by it.
func (r *reconciler[S]) children(ctx context.Context, g client.Object) ([]client.Object, error) {
	seen := map[string]client.Object{}
	for _, opt := range []client.ListOption{
		client.MatchingLabels{wellknown.LabelGrid: g.GetName()},
		client.MatchingFields{ownerIndex: g.GetName()},
	} {
		list := r.k.NewChildList()
		if err := r.c.List(ctx, list, client.InNamespace(g.GetNamespace()), opt); err != nil {
			return nil, fmt.Errorf("list %ss: %w", r.k.Kind, err)
		}
		for _, c := range r.k.Items(list) {
			seen[c.GetName()] = c
		}
	}
	out := make([]client.Object, 0, len(seen))
	for _, n := range slices.Sorted(maps.Keys(seen)) {
		out = append(out, seen[n])
	}
	return out, nil
}

// nodeUnitLabels maps the units of key to their NodeUnit's labels (only
// the topology's unit label has NodeUnits).
func (r *reconciler[S]) nodeUnitLabels(ctx context.Context, key string) (map[string]map[string]string, error) {
	if key != r.cfg.UnitLabel {
		return nil, nil
	}
	var list appsv1alpha1.NodeUnitList
	if err := r.c.List(ctx, &list); err != nil {
		if meta.IsNoMatchError(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("list nodeunits: %w", err)
	}
	out := map[string]map[string]string{}
	for _, nu := range list.Items {
		out[nu.Name] = nu.Labels
	}
	return out, nil
}

// edited reports whether c's spec changed since this process applied it.
func (r *reconciler[S]) edited(c client.Object) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	gen, ok := r.applied[c.GetUID()]
	return ok && gen != c.GetGeneration()
}

// apply server-side-applies a child as atoll-cloud and returns the result.
func (r *reconciler[S]) apply(ctx context.Context, ch child, since time.Time) (client.Object, error) {
	u := ch.Object.DeepCopy()
	ann := u.GetAnnotations()
	ann[wellknown.AnnotationGridRevisionSince] = since.UTC().Format(time.RFC3339)
	u.SetAnnotations(ann)
	if err := r.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(wellknown.FieldManager), client.ForceOwnership); err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", r.k.Kind, u.GetNamespace(), u.GetName(), err)
	}
	r.metrics.writes.WithLabelValues(r.k.Kind, "apply").Inc()
	out := r.k.NewChild()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		return nil, fmt.Errorf("apply %s %s: result: %w", r.k.Kind, u.GetName(), err)
	}
	r.mu.Lock()
	r.applied[out.GetUID()] = out.GetGeneration()
	r.mu.Unlock()
	r.log.Info("applied grid child", "kind", r.k.Kind, "namespace", u.GetNamespace(), "name", u.GetName(), "unit", ch.Unit, "revision", ch.Revision)
	return out, nil
}

// delete deletes a child of a vanished unit.
func (r *reconciler[S]) delete(ctx context.Context, c client.Object) error {
	uid := c.GetUID()
	err := r.c.Delete(ctx, c, client.Preconditions{UID: &uid}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s %s/%s: %w", r.k.Kind, c.GetNamespace(), c.GetName(), err)
	}
	r.metrics.writes.WithLabelValues(r.k.Kind, "delete").Inc()
	r.mu.Lock()
	delete(r.applied, uid)
	r.mu.Unlock()
	r.log.Info("deleted grid child of a vanished unit", "kind", r.k.Kind, "namespace", c.GetNamespace(), "name", c.GetName())
	return nil
}

// release drops g's controller reference from a child relabeled away
// from it.
func (r *reconciler[S]) release(ctx context.Context, g, c client.Object) error {
	base := c.DeepCopyObject().(client.Object)
	refs := slices.DeleteFunc(slices.Clone(c.GetOwnerReferences()), func(ref metav1.OwnerReference) bool { return ref.UID == g.GetUID() })
	c.SetOwnerReferences(refs)
	err := r.c.Patch(ctx, c, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(wellknown.FieldManager))
	if err != nil {
		return fmt.Errorf("release %s %s/%s: %w", r.k.Kind, c.GetNamespace(), c.GetName(), err)
	}
	r.metrics.writes.WithLabelValues(r.k.Kind, "release").Inc()
	r.log.Info("released grid child", "kind", r.k.Kind, "namespace", c.GetNamespace(), "name", c.GetName())
	return nil
}

// writeStatus patches g's status to next.
func (r *reconciler[S]) writeStatus(ctx context.Context, g client.Object, next *appsv1alpha1.GridStatus) error {
	before := g.GetResourceVersion()
	base := g.DeepCopyObject().(client.Object)
	*r.k.Status(g) = *next
	if err := r.c.Status().Patch(ctx, g, client.MergeFrom(base), client.FieldOwner(wellknown.FieldManager)); err != nil {
		return fmt.Errorf("status of %s %s/%s: %w", r.k.GridKind, g.GetNamespace(), g.GetName(), err)
	}
	r.wrote.Store(client.ObjectKeyFromObject(g), statusWrite{before: before, status: next.DeepCopy()})
	r.metrics.writes.WithLabelValues(r.k.Kind, "status").Inc()
	return nil
}

// unitsOf counts the nodes of each value of key.
func unitsOf(ctx context.Context, c client.Reader, key string) (map[string]int, error) {
	var nodes corev1.NodeList
	if err := c.List(ctx, &nodes, client.HasLabels{key}); err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out := map[string]int{}
	for _, n := range nodes.Items {
		if v := n.Labels[key]; v != "" {
			out[v]++
		}
	}
	return out, nil
}

// observeDeployment: the Deployment observed its spec and every replica is
// updated, ready and available, with no old ones left.
func observeDeployment(c client.Object, u *appsv1alpha1.UnitStatus) {
	d := c.(*appsv1.Deployment)
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	u.Replicas, u.ReadyReplicas, u.UpdatedReplicas, u.AvailableReplicas = s.Replicas, s.ReadyReplicas, s.UpdatedReplicas, s.AvailableReplicas
	u.Ready = s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.ReadyReplicas == want && s.AvailableReplicas == want && s.Replicas == want
	u.Conditions = nil
	for _, c := range d.Status.Conditions {
		u.Conditions = append(u.Conditions, appsv1alpha1.ChildCondition{Type: string(c.Type), Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
}

// deploymentCompleted: the Deployment controller reports its latest
// spec rolled out (Progressing True, NewReplicaSetAvailable), which it
// keeps until the next rollout whatever its pods do since.
func deploymentCompleted(c client.Object) bool {
	d := c.(*appsv1.Deployment)
	if d.Status.ObservedGeneration < d.Generation {
		return false
	}
	for _, cond := range d.Status.Conditions {
		if cond.Type == appsv1.DeploymentProgressing {
			return cond.Status == corev1.ConditionTrue && cond.Reason == "NewReplicaSetAvailable"
		}
	}
	return false
}

// statefulSetCompleted: the StatefulSet controller rolled its latest spec
// out to every replica (its current revision is the update revision).
func statefulSetCompleted(c client.Object) bool {
	d := c.(*appsv1.StatefulSet)
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	return s.ObservedGeneration >= d.Generation && s.UpdateRevision != "" && s.CurrentRevision == s.UpdateRevision && s.UpdatedReplicas == want
}

// observeStatefulSet: the StatefulSet observed its spec and every replica
// is updated, ready and available.
func observeStatefulSet(c client.Object, u *appsv1alpha1.UnitStatus) {
	d := c.(*appsv1.StatefulSet)
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	s := d.Status
	u.Replicas, u.ReadyReplicas, u.UpdatedReplicas, u.AvailableReplicas = s.Replicas, s.ReadyReplicas, s.UpdatedReplicas, s.AvailableReplicas
	u.Ready = s.ObservedGeneration >= d.Generation && s.UpdatedReplicas == want && s.ReadyReplicas == want && s.AvailableReplicas == want
	u.Conditions = nil
	for _, c := range d.Status.Conditions {
		u.Conditions = append(u.Conditions, appsv1alpha1.ChildCondition{Type: string(c.Type), Status: c.Status, Reason: c.Reason, Message: c.Message})
	}
}
