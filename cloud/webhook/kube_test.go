package webhook

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/atoll-edge/atoll/test/poll"

	"github.com/prometheus/client_golang/prometheus"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/test/kubetest"
)

const (
	unitLabel     = wellknown.LabelUnit
	protectedNode = "edge-protected"
	lostNode      = "edge-lost"
	unlabeledNode = "edge-unlabeled" // protected by the policy, but in no unit
	testNamespace = "web"
)

// TestAgainstAPIServer registers the webhook with a real kube-apiserver and
// checks what the apiserver stores after Node, EndpointSlice and Endpoints
// writes.
func TestAgainstAPIServer(t *testing.T) {
	begin := time.Now()
	cluster := kubetest.Start(t)
	t.Logf("etcd + kube-apiserver ready in %s", time.Since(begin).Round(time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	client := cluster.Client()

	certDir := t.TempDir()
	if err := cluster.WriteServingCert(certDir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := New(Config{Addr: "127.0.0.1:0", CertDir: certDir}, protecting(protectedNode, unlabeledNode), testLogger(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop(context.Background()) })

	regCfg := RegistrationConfig{URL: "https://" + srv.Addr() + DefaultPath, CABundle: cluster.CABundle()}
	registered := time.Now()
	if err := Register(ctx, client, regCfg); err != nil {
		t.Fatalf("Register: %v", err)
	}
	for _, n := range []struct {
		name   string
		labels map[string]string
	}{
		{protectedNode, map[string]string{unitLabel: "u1"}},
		{lostNode, map[string]string{unitLabel: "u1"}},
		{unlabeledNode, nil},
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels}}
		if _, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create node %s: %v", n.name, err)
		}
	}
	if err := cluster.CreateNamespace(ctx, testNamespace); err != nil {
		t.Fatal(err)
	}

	// The apiserver loads webhook configurations from an informer: the
	// webhook is called only some time after Register returns. Write until
	// a write comes back mutated.
	err = poll.Until(ctx, func(ctx context.Context) error {
		n, err := addTaints(ctx, client, protectedNode, unreachableNoSchedule, unreachableNoExecute)
		if err != nil {
			return err
		}
		if hasTaint(n, unreachableNoExecute) {
			return errors.New("webhook not called yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("webhook never became effective: %v", err)
	}
	t.Logf("webhook effective %s after Register", time.Since(registered).Round(time.Millisecond))

	t.Run("protected node keeps NoSchedule, loses NoExecute", func(t *testing.T) {
		// An update (as above) and a merge patch of the taint list, the way
		// the node lifecycle controller writes it.
		patch := fmt.Sprintf(`{"spec":{"taints":[{"key":%q,"effect":"NoSchedule"},{"key":%q,"effect":"NoExecute","timeAdded":%q}]}}`,
			corev1.TaintNodeUnreachable, corev1.TaintNodeUnreachable, time.Now().UTC().Format(time.RFC3339))
		n, err := client.CoreV1().Nodes().Patch(ctx, protectedNode, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		stored, err := client.CoreV1().Nodes().Get(ctx, protectedNode, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, node := range []*corev1.Node{n, stored} {
			if hasTaint(node, unreachableNoExecute) || !hasTaint(node, unreachableNoSchedule) {
				t.Errorf("taints %v, want unreachable:NoSchedule without unreachable:NoExecute", node.Spec.Taints)
			}
		}
	})

	t.Run("unprotected node keeps both", func(t *testing.T) {
		for _, name := range []string{lostNode, unlabeledNode} {
			if _, err := addTaints(ctx, client, name, unreachableNoSchedule, unreachableNoExecute); err != nil {
				t.Fatal(err)
			}
			n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if !hasTaint(n, unreachableNoExecute) || !hasTaint(n, unreachableNoSchedule) {
				t.Errorf("%s: taints %v, want both unreachable taints", name, n.Spec.Taints)
			}
		}
	})

	t.Run("unprotected node that reports itself Ready loses NoExecute", func(t *testing.T) {
		// The node lifecycle controller taints from its cache: here it
		// had the loss, and the kubelet has reported Ready since.
		n, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-back", Labels: map[string]string{unitLabel: "u1"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := addTaints(ctx, client, n.Name, unreachableNoSchedule, unreachableNoExecute); err != nil {
			t.Fatal(err)
		}
		stored, err := client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if hasTaint(stored, unreachableNoExecute) || !hasTaint(stored, unreachableNoSchedule) {
			t.Errorf("taints %v, want unreachable:NoSchedule without unreachable:NoExecute", stored.Spec.Taints)
		}
	})

	t.Run("endpointslice", func(t *testing.T) {
		no := ptr(false)
		api := client.DiscoveryV1().EndpointSlices(testNamespace)
		in := &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints: []discoveryv1.Endpoint{
				endpoint("10.64.0.1", protectedNode, conds(no, no, no)),
				endpoint("10.64.0.2", lostNode, conds(no, no, no)),
				endpoint("10.64.0.3", protectedNode, conds(no, no, ptr(true))),
			},
			Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
		}
		created, err := api.Create(ctx, in, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkSlice(t, "create", created)

		// The endpoint slice controller marks the endpoint not ready again.
		created.Endpoints[0].Conditions = conds(no, no, no)
		if _, err := api.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		stored, err := api.Get(ctx, "web-1", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkSlice(t, "update", stored)
	})

	t.Run("endpoints", func(t *testing.T) {
		eps := client.CoreV1().Endpoints(testNamespace)
		ports := []corev1.EndpointPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}
		notReady := []corev1.EndpointSubset{
			{
				Addresses: addrs(addr("10.64.1.1", lostNode)),
				NotReadyAddresses: addrs(addr("10.64.1.2", protectedNode), addr("10.64.1.3", lostNode),
					addr("10.64.1.4", protectedNode), addr("10.64.1.5", lostNode)),
				Ports: ports,
			},
			{
				NotReadyAddresses: addrs(addr("10.64.2.1", lostNode), addr("10.64.2.2", protectedNode)),
				Ports:             []corev1.EndpointPort{{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}},
			},
		}
		want := []corev1.EndpointSubset{
			{
				Addresses:         addrs(addr("10.64.1.1", lostNode), addr("10.64.1.2", protectedNode), addr("10.64.1.4", protectedNode)),
				NotReadyAddresses: addrs(addr("10.64.1.3", lostNode), addr("10.64.1.5", lostNode)),
				Ports:             ports,
			},
			{
				Addresses:         addrs(addr("10.64.2.2", protectedNode)),
				NotReadyAddresses: addrs(addr("10.64.2.1", lostNode)),
				Ports:             []corev1.EndpointPort{{Name: "metrics", Port: 9090, Protocol: corev1.ProtocolTCP}},
			},
		}
		in := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Subsets: notReady}
		created, err := eps.Create(ctx, in.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkEqual(t, "subsets after create", want, created.Subsets)

		created.Subsets = notReady
		if _, err := eps.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		stored, err := eps.Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkEqual(t, "subsets after update", want, stored.Subsets)
	})

	t.Run("metrics", func(t *testing.T) {
		for _, c := range []struct{ kind, result string }{
			{kindNode, resultPatched},
			{kindNode, resultUnchanged},
			{kindEndpointSlice, resultPatched},
			{kindEndpoints, resultPatched},
		} {
			if counter(t, reg, c.kind, c.result) == 0 {
				t.Errorf("requests_total{kind=%q,result=%q} = 0", c.kind, c.result)
			}
		}
		for _, k := range []string{kindNode, kindEndpoints, kindEndpointSlice} {
			if n := counter(t, reg, k, resultError); n != 0 {
				t.Errorf("requests_total{kind=%q,result=error} = %v", k, n)
			}
		}
	})

	t.Run("register is idempotent and converges", func(t *testing.T) {
		mwcs := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
		before, err := mwcs.Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkConfiguration(t, before, regCfg, 2)
		if err := Register(ctx, client, regCfg); err != nil {
			t.Fatal(err)
		}
		again, err := mwcs.Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if again.ResourceVersion != before.ResourceVersion {
			t.Errorf("re-registering the same config wrote it (resourceVersion %s → %s)", before.ResourceVersion, again.ResourceVersion)
		}

		// Someone edits a webhook; the next Register takes it back.
		again.Webhooks[0].TimeoutSeconds = ptr(int32(9))
		if _, err := mwcs.Update(ctx, again, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		changed := regCfg
		changed.TimeoutSeconds = 5
		if err := Register(ctx, client, changed); err != nil {
			t.Fatal(err)
		}
		after, err := mwcs.Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkConfiguration(t, after, regCfg, 5)

		// Fail-open drops the guard; the default brings it back.
		open := regCfg
		open.FailOpen = true
		if err := Register(ctx, client, open); err != nil {
			t.Fatal(err)
		}
		after, err = mwcs.Get(ctx, DefaultName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkConfiguration(t, after, open, 2)
		if err := Register(ctx, client, regCfg); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("module", func(t *testing.T) {
		testModuleRegisters(t, client, certDir, regCfg)
	})
}

// addTaints updates node name with the taints it lacks and returns the
// stored node.
func addTaints(ctx context.Context, client kubernetes.Interface, name string, taints ...corev1.Taint) (*corev1.Node, error) {
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for _, t := range taints {
		if !hasTaint(n, t) {
			n.Spec.Taints = append(n.Spec.Taints, t)
		}
	}
	return client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
}

func hasTaint(n *corev1.Node, want corev1.Taint) bool {
	return slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == want.Key && t.Effect == want.Effect })
}

// checkSlice: the protected node's live endpoint is ready and serving, the
// lost node's and the terminating one are not.
func checkSlice(t *testing.T, what string, s *discoveryv1.EndpointSlice) {
	t.Helper()
	want := []discoveryv1.EndpointConditions{
		conds(ptr(true), ptr(true), ptr(false)),
		conds(ptr(false), ptr(false), ptr(false)),
		conds(ptr(false), ptr(false), ptr(true)),
	}
	got := make([]discoveryv1.EndpointConditions, 0, len(s.Endpoints))
	for _, ep := range s.Endpoints {
		got = append(got, ep.Conditions)
	}
	checkEqual(t, what+": conditions", want, got)
}

func checkConfiguration(t *testing.T, c *admissionregistrationv1.MutatingWebhookConfiguration, cfg RegistrationConfig, timeout int32) {
	t.Helper()
	want := 4
	if cfg.FailOpen {
		want = 3
	}
	if len(c.Webhooks) != want {
		t.Fatalf("%d webhooks, want %d", len(c.Webhooks), want)
	}
	wantRules := map[string]admissionregistrationv1.RuleWithOperations{
		WebhookNodes:          rule("", "nodes", admissionregistrationv1.ClusterScope, admissionregistrationv1.Update),
		WebhookGuard:          rule("", "nodes", admissionregistrationv1.ClusterScope, admissionregistrationv1.Update),
		WebhookEndpoints:      rule("", "endpoints", admissionregistrationv1.NamespacedScope, admissionregistrationv1.Create, admissionregistrationv1.Update),
		WebhookEndpointSlices: rule("discovery.k8s.io", "endpointslices", admissionregistrationv1.NamespacedScope, admissionregistrationv1.Create, admissionregistrationv1.Update),
	}
	for _, w := range c.Webhooks {
		r, ok := wantRules[w.Name]
		if !ok {
			t.Errorf("unexpected webhook %s", w.Name)
			continue
		}
		checkEqual(t, w.Name+" rules", []admissionregistrationv1.RuleWithOperations{r}, w.Rules)
		policy, conditions := admissionregistrationv1.Ignore, 0
		switch {
		case w.Name == WebhookGuard:
			policy, conditions = admissionregistrationv1.Fail, 3
		case w.Name == WebhookNodes && !cfg.FailOpen:
			conditions = 1
		}
		if len(w.MatchConditions) != conditions {
			t.Errorf("%s: %d match conditions, want %d", w.Name, len(w.MatchConditions), conditions)
		}
		switch {
		case *w.FailurePolicy != policy,
			*w.SideEffects != admissionregistrationv1.SideEffectClassNone,
			*w.MatchPolicy != admissionregistrationv1.Equivalent,
			*w.ReinvocationPolicy != admissionregistrationv1.IfNeededReinvocationPolicy,
			*w.TimeoutSeconds != timeout,
			!slices.Equal(w.AdmissionReviewVersions, []string{"v1"}),
			w.ClientConfig.URL == nil || *w.ClientConfig.URL != cfg.URL,
			string(w.ClientConfig.CABundle) != string(cfg.CABundle):
			t.Errorf("%s: unexpected settings %+v", w.Name, w)
		}
		var wantSel *metav1.LabelSelector
		if w.Name == WebhookNodes || w.Name == WebhookGuard {
			wantSel = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: unitLabel, Operator: metav1.LabelSelectorOpExists}}}
		} else {
			wantSel = &metav1.LabelSelector{} // the apiserver's default: everything
		}
		checkEqual(t, w.Name+" object selector", wantSel, w.ObjectSelector)
	}
}

func rule(group, resource string, scope admissionregistrationv1.ScopeType, ops ...admissionregistrationv1.OperationType) admissionregistrationv1.RuleWithOperations {
	return admissionregistrationv1.RuleWithOperations{
		Operations: ops,
		Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{"v1"}, Resources: []string{resource}, Scope: &scope,
		},
	}
}
