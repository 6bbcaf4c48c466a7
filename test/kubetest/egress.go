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

// EgressTLS are the PEM files kube-apiserver's egress selector uses to
// reach a TCP CONNECT proxy over mutual TLS (tlsConfig of transport.tcp).
type EgressTLS struct {
	CABundle, ClientCert, ClientKey string
}

// WithClusterEgressTLS is WithClusterEgress to a TCP proxy ("host:port")
// over mutual TLS: url https://proxy with tls's files.
func WithClusterEgressTLS(proxy string, tls EgressTLS) Option {
	return func(c *Config) { c.ClusterEgress, c.ClusterEgressTLS = proxy, &tls }
}

// egressSelectorConfig is the EgressSelectorConfiguration for proxy.
func egressSelectorConfig(proxy string, tls *EgressTLS) string {
	transport := "      tcp:\n        url: http://" + proxy + "\n"
	if tls != nil {
		transport = "      tcp:\n        url: https://" + proxy + "\n        tlsConfig:\n" +
			"          caBundle: " + tls.CABundle + "\n          clientCert: " + tls.ClientCert + "\n          clientKey: " + tls.ClientKey + "\n"
	}
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
	if err := os.WriteFile(path, []byte(egressSelectorConfig(c.cfg.ClusterEgress, c.cfg.ClusterEgressTLS)), 0o600); err != nil {
		return nil, fmt.Errorf("write egress selector config: %w", err)
	}
	return []string{"--egress-selector-config-file=" + path}, nil
}
