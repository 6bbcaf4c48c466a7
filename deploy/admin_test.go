package deploy_test

import (
	"net"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestAdminEndpointsAuthenticated: every Atoll container that binds its
// admin endpoints off loopback (for the kubelet's probes) is given the
// bearer token file from a mounted Secret, or mutual TLS: without either,
// atoll-cloud and atoll-edge refuse to start (internal/admin).
func TestAdminEndpointsAuthenticated(t *testing.T) {
	checked := 0
	for name, objs := range objects(t) {
		for _, o := range objs {
			spec, ok, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
			if !ok {
				continue
			}
			secretVolumes := map[string]bool{}
			vols, _, _ := unstructured.NestedSlice(spec, "volumes")
			for _, v := range vols {
				if _, ok, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName"); ok {
					n, _, _ := unstructured.NestedString(v.(map[string]any), "name")
					secretVolumes[n] = true
				}
			}
			containers, _, _ := unstructured.NestedSlice(spec, "containers")
			for _, c := range containers {
				c := c.(map[string]any)
				args, _, _ := unstructured.NestedStringSlice(c, "args")
				flags := map[string]string{}
				for _, a := range args {
					if k, v, ok := strings.Cut(a, "="); ok {
						flags[k] = v
					}
				}
				addr, ok := flags["--admin-addr"]
				if !ok {
					continue
				}
				host, _, err := net.SplitHostPort(addr)
				if err != nil {
					t.Errorf("%s: %s: --admin-addr=%s: %v", name, o.GetName(), addr, err)
					continue
				}
				if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
					continue
				}
				checked++
				if flags["--admin-tls-cert"] != "" && flags["--admin-client-ca"] != "" {
					continue
				}
				token := flags["--admin-token-file"]
				if token == "" {
					t.Errorf("%s: %s binds --admin-addr=%s off loopback without --admin-token-file or mutual TLS: it would refuse to start", name, o.GetName(), addr)
					continue
				}
				mounted := false
				mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
				for _, m := range mounts {
					m := m.(map[string]any)
					path, _, _ := unstructured.NestedString(m, "mountPath")
					vol, _, _ := unstructured.NestedString(m, "name")
					if secretVolumes[vol] && strings.HasPrefix(token, strings.TrimSuffix(path, "/")+"/") {
						mounted = true
					}
				}
				if !mounted {
					t.Errorf("%s: %s: --admin-token-file=%s is not in a mounted Secret volume", name, o.GetName(), token)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no container binds its admin endpoints off loopback: the check checked nothing")
	}
}
