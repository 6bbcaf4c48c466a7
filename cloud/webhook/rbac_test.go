package webhook

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestDeployRBAC applies deploy/base/atoll-cloud.yaml to a real apiserver and
// checks, as atoll-cloud's ServiceAccount (a TokenRequest token), that it
// may do what its code does and nothing wider: register its own webhook
// configuration (and no other), patch Nodes and endpoints, hold its leader
// Lease, keep its generated certificates in its one Secret. (The e2e runs
// the whole of atoll-cloud as this account: test/e2e's
// TestLeastPrivilege.)
func TestDeployRBAC(t *testing.T) {
	cluster := kubetest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	admin := cluster.Client()
	data, err := deploy.Read(deploy.CloudManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.DecodeManifests(deploy.CloudManifest, data)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.Apply(ctx, objs, kubetest.ApplyOptions{}); err != nil {
		t.Fatal(err)
	}

	const sa = "system:serviceaccount:atoll-system:atoll-cloud"
	rc, err := cluster.ServiceAccountConfig(ctx, "atoll-system", "atoll-cloud", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:atoll-system", "system:authenticated"}
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
	if !apierrors.IsForbidden(errors.Unwrap(err)) || !strings.Contains(err.Error(), "deploy/base/atoll-cloud.yaml") {
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
		{"get", "", "secrets", "atoll-system", "atoll-cloud-webhook-certs", true},
		{"update", "", "secrets", "atoll-system", "atoll-cloud-webhook-certs", true},

		{"get", "", "secrets", "atoll-system", "atoll-cloud", false},
		{"list", "", "secrets", "atoll-system", "", false},
		{"create", "", "secrets", "atoll-system", "", false},
		{"delete", "", "secrets", "atoll-system", "atoll-cloud-webhook-certs", false},
		{"list", "", "nodes", "", "", true}, // the informers' fallback where the apiserver cannot stream a watch's initial state
		{"get", "", "pods", "shop", "web-1", false},
	} {
		review, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: sa, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
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
