package grid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/atoll-edge/atoll/internal/wellknown"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// renderService builds a ServiceGrid's Service `<grid>-svc`: the
// template's spec, the grid labels, the controller reference and the
// topology keys annotation ["<gridUniqKey>"].
func renderService(g *appsv1alpha1.ServiceGrid, key string) (*unstructured.Unstructured, string, error) {
	name := ServiceName(g.Name)
	if len(name) > maxServiceName {
		return nil, "", invalid("Service name %q is longer than %d characters", name, maxServiceName)
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: g.Namespace,
			Labels:          map[string]string{wellknown.LabelGrid: g.Name},
			Annotations:     map[string]string{wellknown.TopologyKeysAnnotation: key},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(g, appsv1alpha1.GroupVersion.WithKind("ServiceGrid"))},
		},
		Spec: *g.Spec.Template.DeepCopy(),
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(svc)
	if err != nil {
		return nil, "", err
	}
	u := &unstructured.Unstructured{Object: obj}
	clean(u)
	rev, err := revision(u.Object)
	if err != nil {
		return nil, "", err
	}
	ann := u.GetAnnotations()
	ann[wellknown.AnnotationGridRevision] = rev
	u.SetAnnotations(ann)
	return u, rev, nil
}

// serviceReconciler runs the ServiceGrids.
type serviceReconciler struct {
	c       client.Client
	cfg     Config
	log     *slog.Logger
	rec     record.EventRecorder
	metrics *metrics
	warned  warnings
}

// Reconcile applies a ServiceGrid's Service when it is missing or has
// another revision, and writes the status when it changed.
func (r *serviceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var g appsv1alpha1.ServiceGrid
	if err := r.c.Get(ctx, req.NamespacedName, &g); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if g.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	key := g.Spec.GridUniqKey
	if key == "" {
		key = r.cfg.UnitLabel
	}
	next := g.Status.DeepCopy()
	next.ObservedGeneration = g.Generation
	u, rev, err := renderService(&g, key)
	var problem string
	switch {
	case err != nil && isInvalid(err):
		problem = err.Error()
	case err != nil:
		return reconcile.Result{}, err
	default:
		var cur corev1.Service
		err := r.c.Get(ctx, client.ObjectKey{Namespace: g.Namespace, Name: u.GetName()}, &cur)
		if client.IgnoreNotFound(err) != nil {
			return reconcile.Result{}, err
		}
		ref := metav1.GetControllerOf(&cur)
		switch {
		case err == nil && ref != nil && ref.UID != g.UID:
			problem = fmt.Sprintf("Service %s is controlled by %s %s", cur.Name, ref.Kind, ref.Name)
		case err == nil && ref != nil && cur.Annotations[wellknown.AnnotationGridRevision] == rev:
			// Current: nothing to write.
		default:
			if err := r.c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(wellknown.FieldManager), client.ForceOwnership); err != nil {
				return reconcile.Result{}, fmt.Errorf("apply Service %s/%s: %w", g.Namespace, u.GetName(), err)
			}
			r.metrics.writes.WithLabelValues("Service", "apply").Inc()
			r.log.Info("applied grid service", "namespace", g.Namespace, "name", u.GetName(), "revision", rev)
		}
		next.Service = u.GetName()
	}
	if problem != "" {
		c := meta.FindStatusCondition(next.Conditions, appsv1alpha1.ConditionInvalid)
		if fresh := r.warned.first(g.UID, problem); fresh && (c == nil || c.Status != metav1.ConditionTrue || c.Message != problem) {
			r.rec.Event(&g, corev1.EventTypeWarning, "InvalidSpec", problem)
			r.metrics.invalid.WithLabelValues("ServiceGrid").Inc()
		}
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionInvalid, Status: metav1.ConditionTrue, Reason: "InvalidSpec", Message: problem, ObservedGeneration: g.Generation})
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "InvalidSpec", Message: problem, ObservedGeneration: g.Generation})
	} else {
		r.warned.clear(g.UID)
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionInvalid, Status: metav1.ConditionFalse, Reason: "Valid", ObservedGeneration: g.Generation})
		meta.SetStatusCondition(&next.Conditions, metav1.Condition{Type: appsv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: "ServiceApplied", Message: "Service " + next.Service, ObservedGeneration: g.Generation})
	}
	if !equality.Semantic.DeepEqual(&g.Status, next) {
		base := g.DeepCopy()
		g.Status = *next
		if err := r.c.Status().Patch(ctx, &g, client.MergeFrom(base), client.FieldOwner(wellknown.FieldManager)); err != nil {
			return reconcile.Result{}, fmt.Errorf("status of ServiceGrid %s/%s: %w", g.Namespace, g.Name, err)
		}
		r.metrics.writes.WithLabelValues("Service", "status").Inc()
	}
	return reconcile.Result{RequeueAfter: r.cfg.Resync}, nil
}

func isInvalid(err error) bool { return err != nil && errors.Is(err, ErrInvalid) }
