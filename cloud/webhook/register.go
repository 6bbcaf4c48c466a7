package webhook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/atoll-edge/atoll/internal/wellknown"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	arv1ac "k8s.io/client-go/applyconfigurations/admissionregistration/v1"
	metav1ac "k8s.io/client-go/applyconfigurations/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Names of the three webhooks in the configuration.
const (
	WebhookNodes          = "nodes.health.atoll.io"
	WebhookEndpoints      = "endpoints.health.atoll.io"
	WebhookEndpointSlices = "endpointslices.health.atoll.io"
)

// Register creates or updates the MutatingWebhookConfiguration cfg
// describes, with server-side apply: idempotent, safe to run from every
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
	if err != nil {
		return fmt.Errorf("apply mutatingwebhookconfiguration %s: %w", *obj.Name, err)
	}
	return nil
}

// configuration builds the apply configuration of cfg (defaults applied).
func configuration(cfg RegistrationConfig) (*arv1ac.MutatingWebhookConfigurationApplyConfiguration, error) {
	ca := cfg.CABundle
	if len(ca) == 0 {
		var err error
		if ca, err = os.ReadFile(filepath.Clean(cfg.CAFile)); err != nil {
			return nil, fmt.Errorf("webhook registration: ca file: %w", err)
		}
	}
	client := arv1ac.WebhookClientConfig().WithCABundle(ca...)
	if cfg.URL != "" {
		client.WithURL(cfg.URL)
	} else {
		client.WithService(arv1ac.ServiceReference().
			WithNamespace(cfg.Service.Namespace).
			WithName(cfg.Service.Name).
			WithPort(cfg.Service.Port).
			WithPath(cfg.Path))
	}
	hook := func(name string, rule *arv1ac.RuleWithOperationsApplyConfiguration) *arv1ac.MutatingWebhookApplyConfiguration {
		return arv1ac.MutatingWebhook().
			WithName(name).
			WithClientConfig(client).
			WithRules(rule).
			WithFailurePolicy(admissionregistrationv1.Ignore).
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
	return arv1ac.MutatingWebhookConfiguration(cfg.Name).
		WithLabels(map[string]string{"app.kubernetes.io/managed-by": wellknown.FieldManager}).
		WithWebhooks(
			hook(WebhookNodes, rule("", "nodes", admissionregistrationv1.ClusterScope, update)).
				WithObjectSelector(metav1ac.LabelSelector().WithMatchExpressions(
					metav1ac.LabelSelectorRequirement().
						WithKey(cfg.UnitLabel).
						WithOperator(metav1.LabelSelectorOpExists))),
			hook(WebhookEndpoints, rule("", "endpoints", admissionregistrationv1.NamespacedScope, create, update)),
			hook(WebhookEndpointSlices, rule(discoveryv1.GroupName, "endpointslices", admissionregistrationv1.NamespacedScope, create, update)),
		), nil
}
