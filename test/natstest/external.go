package natstest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/cloud/identity"
)

// ExternalHubConf is the nats.conf of the external-nats overlay's hub
// servers, read from its manifest (the first document of
// deploy/overlays/external-nats/hub-external.yaml, a ConfigMap) as the
// pods mount it.
func ExternalHubConf(manifest string) (string, error) {
	raw, err := os.ReadFile(manifest)
	if err != nil {
		return "", err
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal([]byte(strings.SplitN(string(raw), "\n---\n", 2)[0]), &cm); err != nil || cm.Kind != "ConfigMap" {
		return "", fmt.Errorf("first document of %s: kind %q, %v", manifest, cm.Kind, err)
	}
	conf := cm.Data["nats.conf"]
	if conf == "" {
		return "", fmt.Errorf("%s: no nats.conf in the ConfigMap", manifest)
	}
	return conf, nil
}

// ExternalHubPorts are where one loopback server of the overlay's hub
// listens.
type ExternalHubPorts struct{ Client, Leaf, HTTP int }

// clusterBlock is the conf's cluster { … } block (no nested braces).
var clusterBlock = regexp.MustCompile(`(?ms)^[ \t]*cluster \{.*?^[ \t]*\}\n`)

// WriteExternalHub writes in dir the files one stock nats-server needs to
// run as a server of the overlay's hub alone, on loopback: its nats.conf
// (from ExternalHubConf of manifest, with the listeners on ports, no
// cluster block, its store and pid file in dir, the leaf listener's
// certificate and key from leafCert and leafKey) and auth/trust.conf
// (trust's, as `atoll-cloud hub-trust` prints it). It returns the
// nats.conf's path; the server reads its name from $POD_NAME.
func WriteExternalHub(manifest, dir string, trust identity.Trust, ports ExternalHubPorts, leafCert, leafKey string) (string, error) {
	conf, err := ExternalHubConf(manifest)
	if err != nil {
		return "", err
	}
	if !clusterBlock.MatchString(conf) {
		return "", fmt.Errorf("%s: no cluster block to take out of nats.conf", manifest)
	}
	conf = clusterBlock.ReplaceAllString(conf, "")
	conf = strings.NewReplacer(
		"listen: 0.0.0.0:4222", fmt.Sprintf("listen: 127.0.0.1:%d", ports.Client),
		"listen: 0.0.0.0:7422", fmt.Sprintf("listen: 127.0.0.1:%d", ports.Leaf),
		"http: 0.0.0.0:8222", fmt.Sprintf("http: 127.0.0.1:%d", ports.HTTP),
		"store_dir: /data", "store_dir: "+filepath.Join(dir, "data"),
		"/etc/nats/leaf-tls/tls.crt", leafCert, "/etc/nats/leaf-tls/tls.key", leafKey,
		"/var/run/nats/", dir+"/",
	).Replace(conf)
	for _, want := range []string{fmt.Sprint(ports.Client), fmt.Sprint(ports.Leaf), fmt.Sprint(ports.HTTP), leafCert} {
		if !strings.Contains(conf, want) {
			return "", fmt.Errorf("%s: nats.conf changed shape: %q not set", manifest, want)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "auth"), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "auth", "trust.conf"), []byte(trust.ServerConfig(filepath.Join(dir, "data", "jwt"))), 0o600); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "nats.conf")
	return path, os.WriteFile(path, []byte(conf), 0o600)
}
