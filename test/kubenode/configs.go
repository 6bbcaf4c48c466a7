package kubenode

import (
	"fmt"
	"os"
	"path/filepath"
	"text/template"
	"time"
)

// LeaseRenewInterval is how often a node's kubelet renews its Lease: a
// quarter of its configuration's nodeLeaseDurationSeconds (10).
const LeaseRenewInterval = 2500 * time.Millisecond

// The node's configuration files, rendered from its layout.
var (
	containerdConfig = template.Must(template.New("containerd").Parse(`version = 4
root = '{{.Disk}}/containerd/root'
state = '{{.Run}}/containerd'
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.tracing.processor.v1.otlp', 'io.containerd.internal.v1.tracing']
[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '{{.Run}}/containerd.sock'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '{{.Run}}/containerd.sock.ttrpc'
  [plugins.'io.containerd.image-verifier.v1.bindir']
    bin_dir = '{{.Disk}}/containerd/image-verifier'
  [plugins.'io.containerd.internal.v1.opt']
    path = '{{.Disk}}/containerd/opt'
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = '{{.Run}}/s'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '{{.SandboxImage}}'
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '{{.Disk}}/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    # Root here lacks CAP_SYS_RESOURCE: runc cannot give the sandbox
    # the kubelet's -998, so scores are clamped to containerd's own.
    restrict_oom_score_adj = true
    cdi_spec_dirs = ['{{.Disk}}/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '{{.Runc}}'
      Root = '{{.Run}}/runc'
      SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['{{.BinDir}}/cni'{{if .AtollCNI}}, '{{.AtollCNI}}'{{end}}]
      conf_dir = '{{.Disk}}/cni/net.d'
`))

	registryHosts = template.Must(template.New("hosts").Parse(`server = "http://{{.Registry}}"
[host."http://{{.Registry}}"]
  capabilities = ["pull", "resolve"]
`))

	// cniConfig is a bridge with host-local addresses, or with
	// KeepPodIPs atoll-ipam over host-local (its snapshot in
	// /var/lib/cni/atoll-ipam, on the node's disk).
	cniConfig = template.Must(template.New("cni").Parse(`{"cniVersion": "1.0.0", "name": "kubenode", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
{{- if .AtollCNI}}
   "ipam": {"type": "atoll-ipam", "delegate":
{{- else}}
   "ipam":
{{- end}}
           {"type": "host-local", "ranges": [[{"subnet": "{{.PodCIDR}}"}]], "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": "{{.Disk}}/cni/ipam"}{{if .AtollCNI}}}{{end}}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
`))

	// kubeletConfig is kubeadm's authentication and authorization (no
	// anonymous requests, webhook authn/authz, the cluster CA for client
	// certificates) with what this machine needs: cgroup v1 allowed,
	// cgroupfs, a cgroup root of the node's own, no swap check, and
	// eviction thresholds the shared disk never reaches.
	kubeletConfig = template.Must(template.New("kubelet").Parse(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{{.CgroupRoot}}
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://{{.Run}}/containerd.sock
failSwapOn: false
address: {{.IP}}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: {{.Disk}}/pki/kubelet.crt
tlsPrivateKeyFile: {{.Disk}}/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: {{.Disk}}/pki/ca.crt}
authorization:
  mode: Webhook
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
{{- if .DNSIP}}
clusterDNS: [{{.DNSIP}}]
{{- end}}
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
registerNode: true
podCIDR: {{.PodCIDR}}
maxPods: 30
nodeStatusReportFrequency: 10s
# A Lease renewed every 2.5 s (LeaseRenewInterval): KCM's grace periods
# in tests are short.
nodeLeaseDurationSeconds: 10
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
serializeImagePulls: false
`))

	// kubeconfig is the kubelet's: the apiserver with the node's
	// credentials, or the node's local API endpoint, which holds them.
	kubeconfig = template.Must(template.New("kubeconfig").Parse(`apiVersion: v1
kind: Config
{{- if .LocalAPI}}
clusters: [{name: kubenode, cluster: {server: "http://{{.LocalAPI}}"}}]
users: [{name: node, user: {}}]
{{- else}}
clusters: [{name: kubenode, cluster: {server: "{{.APIServer}}", certificate-authority: "{{.Disk}}/pki/ca.crt"}}]
users: [{name: node, user: {client-certificate: "{{.Disk}}/pki/node.crt", client-key: "{{.Disk}}/pki/node.key"}}]
{{- end}}
contexts: [{name: kubenode, context: {cluster: kubenode, user: node}}]
current-context: kubenode
`))

	// kubeProxyKubeconfig is kube-proxy's identity, system:kube-proxy (the
	// built-in binding system:node-proxier grants what it reads), or the
	// node's ProxyAPIServer when set (an endpoints proxy on the node).
	kubeProxyKubeconfig = template.Must(template.New("kube-proxy-kubeconfig").Parse(`apiVersion: v1
kind: Config
{{- if .ProxyAPIServer}}
clusters: [{name: kubenode, cluster: {server: "{{.ProxyAPIServer}}"}}]
users: [{name: kube-proxy, user: {}}]
{{- else}}
clusters: [{name: kubenode, cluster: {server: "{{.APIServer}}", certificate-authority: "{{.Disk}}/pki/ca.crt"}}]
users: [{name: kube-proxy, user: {client-certificate: "{{.Disk}}/pki/kube-proxy.crt", client-key: "{{.Disk}}/pki/kube-proxy.key"}}]
{{- end}}
contexts: [{name: kubenode, context: {cluster: kubenode, user: kube-proxy}}]
current-context: kubenode
`))

	// kubeProxyConfig runs kube-proxy in nftables mode; conntrack sysctls
	// are left alone (a network namespace cannot set them).
	kubeProxyConfig = template.Must(template.New("kube-proxy").Parse(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: {{.Name}}
clusterCIDR: {{.ClusterCIDR}}
clientConnection: {kubeconfig: {{.Disk}}/kube-proxy.kubeconfig, contentType: application/vnd.kubernetes.protobuf}
conntrack: {maxPerCore: 0, min: 0}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
syncPeriod: 30s
`))
)

// files are the node's configuration, by path.
func (n *Node) files() (map[string]*template.Template, error) {
	return map[string]*template.Template{
		filepath.Join(n.Disk, "containerd", "config.toml"):               containerdConfig,
		filepath.Join(n.Disk, "certs.d", n.fleet.registry, "hosts.toml"): registryHosts,
		filepath.Join(n.Disk, "cni", "net.d", "10-kubenode.conflist"):    cniConfig,
		filepath.Join(n.Disk, "kubelet-config.yaml"):                     kubeletConfig,
		filepath.Join(n.Disk, "kubelet.kubeconfig"):                      kubeconfig,
		filepath.Join(n.Disk, "kube-proxy.kubeconfig"):                   kubeProxyKubeconfig,
		filepath.Join(n.Disk, "kube-proxy.yaml"):                         kubeProxyConfig,
	}, nil
}

// writeConfig renders every configuration file of the node.
func (n *Node) writeConfig() error {
	files, err := n.files()
	if err != nil {
		return err
	}
	var dnsIP string
	switch {
	case n.fleet.cfg.NodeDNS != nil && n.fleet.cfg.NodeDNS(n.Name):
		dnsIP = n.IP
	case n.fleet.cfg.DNS:
		if dnsIP, err = n.fleet.DNSIP(); err != nil {
			return err
		}
	}
	data := struct {
		*Node
		BinDir, Runc, Registry, SandboxImage, APIServer, ClusterCIDR, DNSIP, LocalAPI, AtollCNI string
	}{n, n.fleet.cfg.BinDir, n.fleet.runc, n.fleet.registry, n.fleet.SandboxImage(), n.fleet.apiServer, ClusterCIDR(n.fleet.cfg.Net), dnsIP, "", ""}
	if n.fleet.cfg.LocalAPI {
		data.LocalAPI = LocalAPIAddr
	}
	if n.fleet.cfg.KeepPodIPs {
		data.AtollCNI = filepath.Join(n.fleet.atollBin, "cni")
	}
	for path, tmpl := range files {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return err
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = tmpl.Execute(f, data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("kubenode: %s: write %s: %w", n.Name, path, err)
		}
	}
	return nil
}
