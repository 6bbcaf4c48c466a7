package webhook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/atoll-edge/atoll/internal/wellknown"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	arv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Names of the webhooks in the configuration.
const (
	WebhookNodes          = "nodes.health.atoll.io"
	WebhookEndpoints      = "endpoints.health.atoll.io"
	WebhookEndpointSlices = "endpointslices.health.atoll.io"
	// WebhookGuard sees only the node lifecycle controller's writes that
	// would start evicting the pods of a node Atoll protects. It fails
	// closed: while no atoll-cloud replica answers, those writes are
	// refused (the controller retries them every monitor period), so an
	// atoll-cloud outage never evicts a protected node. Every other write
	// goes to the fail-open webhooks, so a down atoll-cloud blocks nothing
	// else.
	WebhookGuard = "guard.nodes.health.atoll.io"
)

// guardExpressions are the guard's match conditions (CEL, all must hold):
// the writer is the node lifecycle controller, the node carries Atoll's
// protection (a healthy peer verdict or a unit hold), and the write adds the
// unreachable:NoExecute taint that starts taint-based eviction.
func guardExpressions(users []string) []*arv1ac.MatchConditionApplyConfiguration {
	quoted := make([]string, len(users))
	for i, u := range users {
		quoted[i] = strconv.Quote(u)
	}
	noExecute := func(obj string) string {
		return fmt.Sprintf("has(%[1]s.spec.taints) && %[1]s.spec.taints.exists(t, t.key == %[2]q && t.effect == %[3]q)",
			obj, corev1.TaintNodeUnreachable, corev1.TaintEffectNoExecute)
	}
	return []*arv1ac.MatchConditionApplyConfiguration{
		arv1ac.MatchCondition().WithName("node-lifecycle-controller").
			WithExpression(fmt.Sprintf("request.userInfo.username in [%s]", strings.Join(quoted, ", "))),
		arv1ac.MatchCondition().WithName("protected-by-atoll").
			WithExpression(fmt.Sprintf("has(object.metadata.annotations) && "+
				"((%[1]q in object.metadata.annotations && object.metadata.annotations[%[1]q] == %[2]q) || %[3]q in object.metadata.annotations)",
				wellknown.AnnotationVerdict, wellknown.VerdictHealthy, wellknown.AnnotationHoldUntil)),
		arv1ac.MatchCondition().WithName("adds-unreachable-noexecute").
			WithExpression(fmt.Sprintf("(%s) && !(%s)", noExecute("object"), noExecute("oldObject"))),
	}
}

// notGuarded is the fail-open node webhook's one match condition: every
// node write the guard does not see.
func notGuarded(users []string) *arv1ac.MatchConditionApplyConfiguration {
	var all []string
	for _, c := range guardExpressions(users) {
		all = append(all, "("+*c.Expression+")")
	}
	return arv1ac.MatchCondition().WithName("not-guarded").WithExpression("!(" + strings.Join(all, " && ") + ")")
}

// Register creates or updates the MutatingWebhookConfiguration cfg
// describes (and, with cfg.ProtectedNamespace, the pod readiness policy:
// RegisterPodReadinessPolicy), with server-side apply: idempotent, safe to run from every
// replica at once, and it takes back fields someone else changed. The
// apiserver starts calling a new or changed webhook shortly after (it picks
// up configurations from an informer), not when Register returns.
func Register(ctx context.Context, client kubernetes.Interface, cfg RegistrationConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	obj, err := configuration(cfg.withDefaults())
	if err != nil {
		return err
	}
	_, err = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Apply(ctx, obj,
		metav1.ApplyOptions{FieldManager: wellknown.FieldManager, Force: true})
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("apply mutatingwebhookconfiguration %s: %w (deploy/base/atoll-cloud.yaml creates it and lets atoll-cloud patch only that name: apply it, or disable --webhook-register)", *obj.Name, err)
	}
	if err != nil {
		return fmt.Errorf("apply mutatingwebhookconfiguration %s: %w", *obj.Name, err)
	}
	if cfg.ProtectedNamespace != "" {
		return RegisterPodReadinessPolicy(ctx, client, cfg, cfg.ProtectedNamespace)
	}
	return nil
}

// configuration builds the apply configuration of cfg (defaults applied).
func configuration(cfg RegistrationConfig) (*arv1ac.MutatingWebhookConfigurationApplyConfiguration, error) {
	client := arv1ac.WebhookClientConfig()
	if !cfg.CAInjected {
		ca := cfg.CABundle
		if len(ca) == 0 {
			var err error
			if ca, err = os.ReadFile(filepath.Clean(cfg.CAFile)); err != nil {
				return nil, fmt.Errorf("webhook registration: ca file: %w", err)
			}
		}
		client.WithCABundle(ca...)
	}
	if cfg.URL != "" {
		client.WithURL(cfg.URL)
	} else {
		client.WithService(arv1ac.ServiceReference().
			WithNamespace(cfg.Service.Namespace).
			WithName(cfg.Service.Name).
			WithPort(cfg.Service.Port).
			WithPath(cfg.Path))
	}
	hook := func(name string, policy admissionregistrationv1.FailurePolicyType, rule *arv1ac.RuleWithOperationsApplyConfiguration) *arv1ac.MutatingWebhookApplyConfiguration {
		return arv1ac.MutatingWebhook().
			WithName(name).
			WithClientConfig(client).
			WithRules(rule).
			WithFailurePolicy(policy).
			WithMatchPolicy(admissionregistrationv1.Equivalent).
			WithSideEffects(admissionregistrationv1.SideEffectClassNone).
			WithTimeoutSeconds(cfg.TimeoutSeconds).
			WithAdmissionReviewVersions("v1").
			WithReinvocationPolicy(admissionregistrationv1.IfNeededReinvocationPolicy)
	}
	rule := func(group, resource string, scope admissionregistrationv1.ScopeType, ops ...admissionregistrationv1.OperationType) *arv1ac.RuleWithOperationsApplyConfiguration {
		return arv1ac.RuleWithOperations().
			WithOperations(ops...).
			WithAPIGroups(group).
			WithAPIVersions("v1").
			WithResources(resource).
			WithScope(scope)
	}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	open, closed := admissionregistrationv1.Ignore, admissionregistrationv1.Fail
	inUnit := metav1ac.LabelSelector().WithMatchExpressions(
		metav1ac.LabelSelectorRequirement().
			WithKey(cfg.UnitLabel).
			WithOperator(metav1.LabelSelectorOpExists))
	nodes := hook(WebhookNodes, open, rule("", "nodes", admissionregistrationv1.ClusterScope, update)).WithObjectSelector(inUnit)
	hooks := []*arv1ac.MutatingWebhookApplyConfiguration{nodes}
	if !cfg.FailOpen {
		nodes.WithMatchConditions(notGuarded(cfg.GuardUsers))
		hooks = append(hooks, hook(WebhookGuard, closed, rule("", "nodes", admissionregistrationv1.ClusterScope, update)).
			WithObjectSelector(inUnit).
			WithMatchConditions(guardExpressions(cfg.GuardUsers)...))
	}
	hooks = append(hooks,
		hook(WebhookEndpoints, open, rule("", "endpoints", admissionregistrationv1.NamespacedScope, create, update)),
		hook(WebhookEndpointSlices, open, rule(discoveryv1.GroupName, "endpointslices", admissionregistrationv1.NamespacedScope, create, update)))
	return arv1ac.MutatingWebhookConfiguration(cfg.Name).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": wellknown.FieldManager}).
		WithWebhooks(hooks...), nil
}
