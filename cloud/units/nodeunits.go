package units

// NodeUnits (apps.atoll.io/v1alpha1): one cluster-scoped object per unit,
// kept by a controller of the manager from its Node cache.

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// NodeUnitController names the NodeUnit controller.
const NodeUnitController = "nodeunit"

// labelManagedBy marks the NodeUnits atoll-cloud keeps (and may delete).
const labelManagedBy = "app.kubernetes.io/managed-by"

// UnitStates gives a unit's disruption state (the health service's) and
// tells when it changes.
type UnitStates interface {
	// UnitDisruption is unit's state, and false if the states are not
	// known yet (the NodeUnit then keeps the state it shows).
	UnitDisruption(unit string) (state string, known bool)
	// OnChange registers fn, to be called with each unit whose state
	// changed, once UnitDisruption answers the new one. fn does not block.
	OnChange(fn func(unit string))
}

// UnitStatesFunc adapts a function to UnitStates whose states never
// change.
type UnitStatesFunc func(unit string) string

// UnitDisruption calls f.
func (f UnitStatesFunc) UnitDisruption(unit string) (string, bool) { return f(unit), true }

// OnChange does nothing: f's states never change.
func (f UnitStatesFunc) OnChange(func(string)) {}

// statusSettle is how long a unit's status waits after a Node event or
// a disruption change before it is computed and written: a Node turning
// Ready or not changes the unit's counts and, a moment later, the
// disruption state the health service derives from it; both land in one
// write.
const statusSettle = 2 * time.Second

// nodeUnits keeps the NodeUnits.
type nodeUnits struct {
	c      client.Client
	rule   Rule
	states UnitStates // nil: no disruption state
	log    *slog.Logger
	writes prometheus.Counter
}

// SetupNodeUnits keeps one NodeUnit per unit of rule with m
// (leader only): created for a unit's first node, its status (members,
// Ready and not Ready counts, the disruption state of states, if any)
// written when it changes (statusSettle after Node events and states'
// changes, so that one transition is one write),
// deleted with the unit's last node. Only
// NodeUnits labeled app.kubernetes.io/managed-by=atoll-cloud are deleted;
// labels set by hand on them are kept (the apply owns none), so grid
// overrides can select units by them.
func SetupNodeUnits(m *manager.Manager, rule Rule, states UnitStates, log *slog.Logger, reg prometheus.Registerer) error {
	if err := appsv1alpha1.AddToScheme(m.GetScheme()); err != nil {
		return fmt.Errorf("units: nodeunits: scheme: %w", err)
	}
	r := &nodeUnits{c: m.GetClient(), rule: rule, states: states, log: log.With("component", "units", "controller", NodeUnitController),
		writes: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "atoll", Subsystem: "units", Name: "nodeunit_writes_total",
			Help: "Writes of NodeUnit objects (apply, status, delete).",
		})}
	if reg != nil {
		if err := reg.Register(r.writes); err != nil {
			return fmt.Errorf("units: nodeunits: metrics: %w", err)
		}
	}
	unitOf := func(o client.Object) []reconcile.Request {
		if u := rule.UnitOf(o.GetLabels()); u != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: u}}}
		}
		return nil
	}
	settle := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		for _, o := range objs {
			for _, req := range unitOf(o) {
				q.AddAfter(req, statusSettle)
			}
		}
	}
	b := builder.ControllerManagedBy(m).
		Named(NodeUnitController).
		For(&appsv1alpha1.NodeUnit{}).
		Watches(&corev1.Node{}, handler.Funcs{
			CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				settle(q, e.Object)
			},
			UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				settle(q, e.ObjectOld, e.ObjectNew)
			},
			DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
				settle(q, e.Object)
			},
		}).
		// A new term: every NodeUnit and every unit of a node (one may
		// have none yet), as a new leader's controller would.
		WatchesRawSource(m.TermSource(&appsv1alpha1.NodeUnitList{})).
		WatchesRawSource(m.TermSourceMap(&corev1.NodeList{}, unitOf))
	if states != nil {
		// A disruption change (votes expiring, a hold) comes with no Node
		// event: it enqueues its unit. Changes before the controller runs
		// are covered by its initial listing of every NodeUnit.
		var queue atomic.Pointer[workqueue.TypedRateLimitingInterface[reconcile.Request]]
		states.OnChange(func(unit string) {
			if q := queue.Load(); q != nil && unit != "" {
				(*q).AddAfter(reconcile.Request{NamespacedName: types.NamespacedName{Name: unit}}, statusSettle)
			}
		})
		b = b.WatchesRawSource(source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
			queue.Store(&q)
			return nil
		}))
	}
	// A new term: every NodeUnit, as a new leader's controller would.
	err := b.Complete(m.LeaderOnly(r))
	if err != nil {
		return fmt.Errorf("units: nodeunits: %w", err)
	}
	return nil
}

// Reconcile brings one NodeUnit in line with its unit's nodes.
func (r *nodeUnits) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	unit := req.Name
	var list corev1.NodeList
	if err := r.c.List(ctx, &list, client.MatchingLabels{r.rule.Label: unit}); err != nil {
		return reconcile.Result{}, err
	}
	nodes := slices.DeleteFunc(list.Items, func(n corev1.Node) bool { return r.rule.Of(&n) != unit })
	var cur appsv1alpha1.NodeUnit
	err := r.c.Get(ctx, req.NamespacedName, &cur)
	exists := err == nil
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	if len(nodes) == 0 {
		if exists && cur.Labels[labelManagedBy] == wellknown.FieldManager && cur.DeletionTimestamp == nil {
			uid := cur.UID
			if err := r.c.Delete(ctx, &cur, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
				return reconcile.Result{}, err
			}
			r.writes.Inc()
			r.log.Info("nodeunit deleted: no node left", "unit", unit)
		}
		return reconcile.Result{}, nil
	}
	if !exists || cur.Spec.UnitLabel != r.rule.Label || cur.Labels[labelManagedBy] != wellknown.FieldManager {
		nu := &appsv1alpha1.NodeUnit{
			TypeMeta:   metav1.TypeMeta{APIVersion: appsv1alpha1.GroupVersion.String(), Kind: "NodeUnit"},
			ObjectMeta: metav1.ObjectMeta{Name: unit, Labels: map[string]string{labelManagedBy: wellknown.FieldManager}},
			Spec:       appsv1alpha1.NodeUnitSpec{UnitLabel: r.rule.Label},
		}
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(nu)
		if err != nil {
			return reconcile.Result{}, err
		}
		u := &unstructured.Unstructured{Object: obj}
		delete(u.Object, "status")
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		if err := r.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(wellknown.FieldManager), client.ForceOwnership); err != nil {
			return reconcile.Result{}, fmt.Errorf("apply nodeunit %s: %w", unit, err)
		}
		r.writes.Inc()
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cur); err != nil {
			return reconcile.Result{}, err
		}
	}
	next := appsv1alpha1.NodeUnitStatus{}
	for _, n := range nodes {
		next.Members = append(next.Members, n.Name)
		if nodeReady(&n) {
			next.ReadyNodes++
		} else {
			next.NotReadyNodes++
		}
	}
	slices.Sort(next.Members)
	if r.states != nil {
		if st, known := r.states.UnitDisruption(unit); known {
			next.Disruption = st
		} else {
			next.Disruption = cur.Status.Disruption // not known yet: no flap after a restart
		}
	}
	if equality.Semantic.DeepEqual(cur.Status, next) {
		return reconcile.Result{}, nil
	}
	base := cur.DeepCopy()
	cur.Status = next
	if err := r.c.Status().Patch(ctx, &cur, client.MergeFrom(base), client.FieldOwner(wellknown.FieldManager)); err != nil {
		return reconcile.Result{}, fmt.Errorf("status of nodeunit %s: %w", unit, err)
	}
	r.writes.Inc()
	return reconcile.Result{}, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
