package natstest_test

import (
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/test/natstest"
)

// TestWriteExternalHub: the external-nats overlay's nats.conf, rewritten
// for one loopback server, parses as nats-server reads it: the ports
// given, no cluster, the store and leaf certificate where given, the
// overlay's settings kept (domain, leaf interest isolation, TLS).
func TestWriteExternalHub(t *testing.T) {
	dir := t.TempDir()
	_, trust, err := identity.Setup(filepath.Join(dir, "identity"))
	if err != nil {
		t.Fatal(err)
	}
	tlsFiles := natstest.NewTLS(t, dir, "leaf")
	ports := natstest.ExternalHubPorts{Client: 14222, Leaf: 17422, HTTP: 18222}
	conf, err := natstest.WriteExternalHub("../../deploy/overlays/external-nats/hub-external.yaml", filepath.Join(dir, "hub"), trust, ports, tlsFiles.CertFile, tlsFiles.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAME", "atoll-hub-0")
	o, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case o.ServerName != "atoll-hub-0", o.Host != "127.0.0.1", o.Port != ports.Client, o.HTTPPort != ports.HTTP,
		o.LeafNode.Port != ports.Leaf:
		t.Fatalf("name %q, client %s:%d, http %d, leaf %d", o.ServerName, o.Host, o.Port, o.HTTPPort, o.LeafNode.Port)
	case o.Cluster.Port != 0 || len(o.Routes) != 0:
		t.Fatalf("cluster port %d, routes %v: want none", o.Cluster.Port, o.Routes)
	case o.StoreDir != filepath.Join(dir, "hub", "data") || o.JetStreamDomain != "hub":
		t.Fatalf("store %q, domain %q", o.StoreDir, o.JetStreamDomain)
	case o.LeafNode.TLSConfig == nil || !o.LeafNode.IsolateLeafnodeInterest || !o.NoSublistCache:
		t.Fatalf("leaf TLS %v, isolated interest %v, no sublist cache %v", o.LeafNode.TLSConfig != nil, o.LeafNode.IsolateLeafnodeInterest, o.NoSublistCache)
	case o.TrustedOperators == nil || o.SystemAccount != trust.SystemAccount:
		t.Fatalf("operator %v, system account %q", o.TrustedOperators, o.SystemAccount)
	}
}
