package webhook

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/internal/testenv/kubetest"
)

// TestDeployRBAC applies deploy/atoll-cloud.yaml's RBAC and webhook
// configuration to a real apiserver and checks, as atoll-cloud's service
// account, that it may do what its code does and nothing wider: register
// its own webhook configuration (and no other), patch Nodes and endpoints,
// hold its leader Lease.
func TestDeployRBAC(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin := cluster.Client()
	applyDeploy(t, ctx, admin, "../../deploy/atoll-cloud.yaml")

	const sa = "system:serviceaccount:atoll-system:atoll-cloud"
	rc := rest.CopyConfig(cluster.RESTConfig())
	rc.Impersonate = rest.ImpersonationConfig{UserName: sa, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:atoll-system", "system:authenticated"}}
	rc.WarningHandler = rest.NoWarnings{}
	as, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	reg := RegistrationConfig{URL: "https://127.0.0.1:9443/mutate", CABundle: cluster.CABundle()}
	if err := Register(ctx, as, reg); err != nil {
		t.Fatalf("register as %s: %v", sa, err)
	}
	other := reg
	other.Name = "someone-else"
	err = Register(ctx, as, other)
	if !apierrors.IsForbidden(errors.Unwrap(err)) || !strings.Contains(err.Error(), "deploy/atoll-cloud.yaml") {
		t.Errorf("register another configuration: %v, want forbidden with a hint", err)
	}

	for _, c := range []struct {
		verb, group, resource, ns, name string
		allowed                         bool
	}{
		{"patch", "", "nodes", "", "edge-1", true},
		{"watch", "", "pods", "", "", true},
		{"patch", "", "endpoints", "shop", "web", true},
		{"patch", "discovery.k8s.io", "endpointslices", "shop", "web-1", true},
		{"get", "coordination.k8s.io", "leases", "atoll-system", "atoll-cloud", true},
		{"update", "coordination.k8s.io", "leases", "atoll-system", "atoll-cloud", true},
		{"create", "coordination.k8s.io", "leases", "atoll-system", "", true},
		{"patch", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "atoll-health", true},

		{"create", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "", false},
		{"delete", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", "", "atoll-health", false},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", "x", false},
		{"update", "coordination.k8s.io", "leases", "atoll-system", "someone-else", false},
		{"update", "coordination.k8s.io", "leases", "kube-system", "kube-controller-manager", false},
		{"delete", "", "nodes", "", "edge-1", false},
		{"update", "", "nodes", "", "edge-1", false},
		{"patch", "", "pods", "shop", "web-1", false},
		{"get", "", "secrets", "atoll-system", "atoll-cloud-webhook-tls", false},
	} {
		review, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: sa, Groups: rc.Impersonate.Groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: c.verb, Group: c.group, Resource: c.resource, Namespace: c.ns, Name: c.name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if review.Status.Allowed != c.allowed {
			t.Errorf("%s %s/%s %s/%s: allowed=%v, want %v", c.verb, c.group, c.resource, c.ns, c.name, review.Status.Allowed, c.allowed)
		}
	}
}

// applyDeploy creates the objects of a deploy/ manifest that this test
// needs (namespace, service account, RBAC, webhook configuration).
func applyDeploy(t *testing.T, ctx context.Context, c kubernetes.Interface, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	r := utilyaml.NewYAMLReader(bufioReader(data))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		create := func(obj any, do func() error) {
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s: %s: %v", path, meta.Kind, err)
			}
			if err := do(); err != nil {
				t.Fatalf("%s: create %s: %v", path, meta.Kind, err)
			}
		}
		switch meta.Kind {
		case "Namespace":
			var o corev1.Namespace
			create(&o, func() error { _, err := c.CoreV1().Namespaces().Create(ctx, &o, metav1.CreateOptions{}); return err })
		case "ServiceAccount":
			var o corev1.ServiceAccount
			create(&o, func() error {
				_, err := c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
				return err
			})
		case "ClusterRole":
			var o rbacv1.ClusterRole
			create(&o, func() error { _, err := c.RbacV1().ClusterRoles().Create(ctx, &o, metav1.CreateOptions{}); return err })
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			create(&o, func() error {
				_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &o, metav1.CreateOptions{})
				return err
			})
		case "Role":
			var o rbacv1.Role
			create(&o, func() error {
				_, err := c.RbacV1().Roles(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
				return err
			})
		case "RoleBinding":
			var o rbacv1.RoleBinding
			create(&o, func() error {
				_, err := c.RbacV1().RoleBindings(o.Namespace).Create(ctx, &o, metav1.CreateOptions{})
				return err
			})
		case "MutatingWebhookConfiguration":
			var o admissionregistrationv1.MutatingWebhookConfiguration
			create(&o, func() error {
				_, err := c.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &o, metav1.CreateOptions{})
				return err
			})
		}
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
