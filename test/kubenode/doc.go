// Package kubenode runs real Kubernetes nodes for tests: on each, a real
// kubelet (built from the pinned k8s.io/kubernetes, tools/kube) and
// containerd with runc and the CNI plugins (tools/node, Debian's runc),
// registered with a test/kubetest control plane, pulling images from a
// registry this package serves on the hosts' bridge.
//
// A Fleet owns a bridge on the host (kn<net>, 10.199.<net>.1/24) and its
// nodes. Each node has
//   - its own network namespace, joined to the bridge by a veth (node i
//     at 10.199.<net>.(10+i)), its pods on a bridge of its own
//     (10.<240+net>.<i>.0/24), with routes from the host and from every
//     other node;
//   - its own mount namespace, where a tmpfs holds what a reboot loses
//     (sockets, containerd's state, the pods' network namespaces and root
//     filesystems) and the node's own directories are bound over the paths
//     a kubelet and the CNI plugins write whatever their configuration
//     says (/var/lib/kubelet, /var/lib/cni, /var/log/pods,
//     /var/log/containers), and atoll-edge's /var/lib/atoll;
//   - its own cgroup root, under which the kubelet puts every pod;
//   - a disk: containerd's root (images, snapshots), the kubelet's root
//     directory, the CNI allocations, certificates and logs, kept across
//     power cuts as a real disk is.
//
// The kubelet runs as kubeadm sets it up: anonymous authentication off,
// webhook authentication and authorization, a client certificate of
// system:node:<name> (so the apiserver's Node authorizer and
// NodeRestriction apply: ClusterOptions) and a serving certificate from
// the cluster's CA. kube-proxy (nftables mode, as system:kube-proxy, or
// from an endpoints proxy on the node: SetProxyAPIServer) serves the
// Services on each node.
//
// With Config.DNS the fleet runs the cluster DNS as kubeadm installs it:
// CoreDNS (built by tools/dns from its pinned module) as the Deployment
// coredns of kube-system behind the Service kube-dns at the tenth address
// of the service range (DNSIP), which every kubelet gives its pods.
//
// PowerCut kills the kubelet, containerd, the shims and every container
// of a node at once (SIGKILL); Boot drops what a reboot drops and starts
// containerd, the kubelet and kube-proxy again on the same disk. Cut
// drops a node's packets to and from given addresses silently (nftables
// in its namespace), as a link behind a NAT dies; Heal ends it.
//
// It needs root, ip(8), nsenter(1) and unshare(1) (util-linux), runc, and
// the binaries of bin/ (go tool task kube:build node:build dns:build). This
// machine's cgroups are v1, which kubelet v1.36 refuses unless its
// configuration sets failCgroupV1: false: the harness sets it (a test
// setting; production nodes run cgroup v2). The containers' oom_score_adj
// is clamped (containerd's restrict_oom_score_adj): root here lacks
// CAP_SYS_RESOURCE, and runc cannot lower a score without it.
package kubenode
