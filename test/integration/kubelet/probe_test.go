// Package kubelet tests Atoll's parts against real kubelets and
// containerd (test/kubenode): what the edge prober's checks see of a
// node, and Atoll's images running on one.
package kubelet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
)

// TestProbeRealKubelet runs atoll-edge's default peer checks (the
// kubelet's port, its /healthz over HTTPS with no credentials) against a
// real kubelet set up as kubeadm does (anonymous authentication off,
// webhook authn/authz):
//   - up, it answers /healthz with 401, and both checks pass: the peer is
//     normal (a kubelet that answers is up);
//   - the same with kube-apiserver stopped (SIGSTOP), as in a site cut off
//     from the cloud: the kubelet answers 401 without asking it;
//   - with a ServiceAccount token granted get nodes/healthz the check gets
//     the kubelet's own health (200); with a token of an account without
//     it, 403: up, reported Refused (the credentials need fixing), never
//     a failure;
//   - powered off (kubelet, containerd and its containers SIGKILLed),
//     both checks fail: the peer is abnormal.
func TestProbeRealKubelet(t *testing.T) {
	cluster, _, node := kubenode.StartWithNode(t, kubenode.Config{Net: 2}, "edge-1")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	target := prober.Target{Name: node.Name, IP: node.IP}
	defaults := prober.DefaultConfig().Plugins
	run := func(cfgs []prober.PluginConfig) []error {
		t.Helper()
		var errs []error
		for _, c := range cfgs {
			p, err := prober.NewPlugin(c)
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, c.Timeout)
			errs = append(errs, p.Check(cctx, target))
			cancel()
		}
		return errs
	}
	up := func(what string, cfgs []prober.PluginConfig) {
		t.Helper()
		for i, err := range run(cfgs) {
			if err != nil {
				t.Errorf("%s: check %s failed: %v", what, cfgs[i].Name, err)
			}
		}
	}

	up("kubelet up", defaults)

	resume, err := cluster.PauseAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	up("kube-apiserver stopped", defaults)
	if err := resume(); err != nil {
		t.Fatal(err)
	}

	withToken := func(account string) []prober.PluginConfig {
		t.Helper()
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: account, Namespace: "default"}}
		if _, err := cluster.Client().CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rc, err := cluster.ServiceAccountConfig(ctx, "default", account, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(path, []byte(rc.BearerToken), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := defaults[1]
		cfg.TokenFile = path
		return []prober.PluginConfig{cfg}
	}
	granted, refusedCfg := withToken("healthz-prober"), withToken("nobody")
	if err := kubenode.GrantKubeletHealthz(ctx, cluster.Client(), kubetest.ServiceAccountUser("default", "healthz-prober")); err != nil {
		t.Fatal(err)
	}
	up("a token granted get nodes/healthz", granted)
	var refused *prober.Refused
	if err := run(refusedCfg)[0]; !errors.As(err, &refused) {
		t.Errorf("a token without get nodes/healthz: %v, want Refused (403)", err)
	} else {
		t.Logf("a token without get nodes/healthz: %v", err)
	}

	node.PowerCut()
	for i, err := range run(defaults) {
		if err == nil || errors.As(err, &refused) {
			t.Errorf("kubelet powered off: check %s: %v, want a failure", defaults[i].Name, err)
		}
	}
}
