package webhook

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	arv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/wellknown"
)

// The pod readiness policy keeps a protected node's endpoints ready with no
// atoll-cloud replica answering. When the node lifecycle controller loses
// a node it marks the node's pods not ready (pods/status, Ready=False), and
// the endpoint controllers then drop them from every EndpointSlice and
// Endpoints; while atoll-cloud runs, the fail-open endpoint webhooks put
// them back, but an outage lets them drop. The policy is a
// ValidatingAdmissionPolicy, evaluated by the apiserver itself: it refuses
// that one write, by the guard users, for a pod whose node is in the
// protected set (the ConfigMaps wellknown.ProtectedNodesPrefix+<unit> that
// the health service keeps, labelled wellknown.ProtectedNodesLabel). The
// controller retries it every monitor period; the pods stay ready, and so
// do their endpoints, for as long as the node stays protected. A kubelet's
// own readiness (a failing probe) is never refused.

// podReadinessPolicy is the apply configuration of the policy for users.
func podReadinessPolicy(users []string) *arv1ac.ValidatingAdmissionPolicyApplyConfiguration {
	quoted := make([]string, len(users))
	for i, u := range users {
		quoted[i] = strconv.Quote(u)
	}
	ready := func(obj, status string) string {
		return fmt.Sprintf("has(%[1]s.status.conditions) && %[1]s.status.conditions.exists(c, c.type == 'Ready' && c.status == %[2]q)", obj, status)
	}
	return arv1ac.ValidatingAdmissionPolicy(wellknown.PodReadinessPolicy).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": wellknown.FieldManager}).
		WithSpec(arv1ac.ValidatingAdmissionPolicySpec().
			WithFailurePolicy(admissionregistrationv1.Fail).
			WithParamKind(arv1ac.ParamKind().WithAPIVersion("v1").WithKind("ConfigMap")).
			WithMatchConstraints(arv1ac.MatchResources().WithResourceRules(
				arv1ac.NamedRuleWithOperations().
					WithOperations(admissionregistrationv1.Update).
					WithAPIGroups("").WithAPIVersions("v1").WithResources("pods/status"))).
			WithMatchConditions(
				arv1ac.MatchCondition().WithName("node-lifecycle-controller").
					WithExpression(fmt.Sprintf("request.userInfo.username in [%s]", strings.Join(quoted, ", "))),
				arv1ac.MatchCondition().WithName("marks-not-ready").
					WithExpression(fmt.Sprintf("(%s) && (%s)", ready("object", "False"), ready("oldObject", "True")))).
			WithValidations(arv1ac.Validation().
				WithExpression("!has(object.spec.nodeName) || !has(params.data) || !(object.spec.nodeName in params.data)").
				WithMessageExpression("'atoll: node ' + object.spec.nodeName + ' is protected by its peers; its pods stay ready'").
				WithReason(metav1.StatusReasonForbidden)))
}

// podReadinessBinding binds the policy to the protected set's ConfigMaps
// in namespace; audit only records what the policy would refuse
// (RegistrationConfig.FailOpen).
func podReadinessBinding(namespace string, audit bool) *arv1ac.ValidatingAdmissionPolicyBindingApplyConfiguration {
	action := admissionregistrationv1.Deny
	if audit {
		action = admissionregistrationv1.Audit
	}
	return arv1ac.ValidatingAdmissionPolicyBinding(wellknown.PodReadinessPolicy).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": wellknown.FieldManager}).
		WithSpec(arv1ac.ValidatingAdmissionPolicyBindingSpec().
			WithPolicyName(wellknown.PodReadinessPolicy).
			WithValidationActions(action).
			WithParamRef(arv1ac.ParamRef().
				WithNamespace(namespace).
				WithSelector(metav1ac.LabelSelector().WithMatchLabels(map[string]string{wellknown.ProtectedNodesLabel: "true"})).
				WithParameterNotFoundAction(admissionregistrationv1.AllowAction)))
}

// RegisterPodReadinessPolicy applies the pod readiness policy and its
// binding (server-side, forced: idempotent from every replica), for the
// guard users of cfg and the protected set in namespace. deploy/base
// creates both, so atoll-cloud needs only patch on their names.
func RegisterPodReadinessPolicy(ctx context.Context, client kubernetes.Interface, cfg RegistrationConfig, namespace string) error {
	cfg = cfg.withDefaults()
	opts := metav1.ApplyOptions{FieldManager: wellknown.FieldManager, Force: true}
	if _, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Apply(ctx, podReadinessPolicy(cfg.GuardUsers), opts); err != nil {
		return policyError("validatingadmissionpolicy", err)
	}
	if _, err := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Apply(ctx, podReadinessBinding(namespace, cfg.FailOpen), opts); err != nil {
		return policyError("validatingadmissionpolicybinding", err)
	}
	return nil
}

func policyError(kind string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("apply %s %s: %w (deploy/base/atoll-cloud.yaml creates it and lets atoll-cloud patch only that name: apply it, or disable --webhook-register)", kind, wellknown.PodReadinessPolicy, err)
	}
	return fmt.Errorf("apply %s %s: %w", kind, wellknown.PodReadinessPolicy, err)
}
