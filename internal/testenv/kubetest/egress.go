package kubetest

import (
	"fmt"
	"os"
	"strings"
)

// WithClusterEgress starts kube-apiserver with an egress selector that
// sends every connection of egress "cluster" (to kubelets: logs, exec,
// attach, port-forward, proxy) as HTTP CONNECT to proxy: "unix:/path"
// (a Unix socket) or "host:port" (plain TCP).
func WithClusterEgress(proxy string) Option { return func(c *Config) { c.ClusterEgress = proxy } }

// egressSelectorConfig is the EgressSelectorConfiguration for proxy.
func egressSelectorConfig(proxy string) string {
	transport := "      tcp:\n        url: http://" + proxy + "\n"
	if path, ok := strings.CutPrefix(proxy, "unix:"); ok {
		transport = "      uds:\n        udsName: " + path + "\n"
	}
	return `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
` + transport
}

// egressArgs writes the egress selector file and returns the flag.
func (c *Cluster) egressArgs() ([]string, error) {
	if c.cfg.ClusterEgress == "" {
		return nil, nil
	}
	path := c.path("egress-selector.yaml")
	if err := os.WriteFile(path, []byte(egressSelectorConfig(c.cfg.ClusterEgress)), 0o600); err != nil {
		return nil, fmt.Errorf("write egress selector config: %w", err)
	}
	return []string{"--egress-selector-config-file=" + path}, nil
}
