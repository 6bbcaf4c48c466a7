// Package podbed installs Atoll as a user installs it, on real nodes
// (test/kubenode): a kubetest control plane, a fleet of real nodes with
// the cluster DNS (cloud nodes labelled control-plane, the edge nodes
// labelled with their units and zones of the same names, as the
// operator guide says), Atoll's images built by deploy/images in the
// fleet's registry, and an overlay of the user's own — one of
// deploy/overlays with components/hub-nodeport, the images and the edges'
// hub address — applied with `kubectl apply --server-side -k`.
//
// Shape "embedded-hub" (the default) runs atoll-cloud on one cloud node,
// its hub's store in the pod (the overlay needs no volume). Shape "ha" runs the
// external hub's three nats-server pods (nats-server built from the module
// go.mod pins, in place of the nats image the overlay names) on two cloud
// nodes, each with a local PersistentVolume, and two atoll-cloud replicas
// kept on the cloud nodes by the user's overlay; the operator's Secrets
// come from `atoll-cloud hub-trust` run beside kubectl, as the overlay's
// header says. The agents enroll by themselves; each edge node's
// kube-proxy reads its agent's endpoints proxy. It serves
// test/integration/install and the demo's --real-nodes.
package podbed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/deploy"
	"github.com/atoll-edge/atoll/deploy/images"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// Options describe the installation.
type Options struct {
	// Net is the fleet's network (kubenode.Config.Net).
	Net int
	// Dir holds the cluster's and the nodes' state, the overlay and the
	// credentials; it is kept.
	Dir string
	// Units are the edge nodes by unit (unit name: node names).
	Units map[string][]string
	// GracePeriod is KCM's node monitor grace period (0: 20 s).
	GracePeriod time.Duration
	// Shape is the overlay of deploy/overlays installed: ShapeEmbedded
	// (empty) or ShapeHA.
	Shape string
	// Autonomy sets the edge nodes up to reboot while their site is cut
	// off (docs/autonomy.md): each node runs the local API endpoint
	// before its kubelet and atoll-ipam as its pods' IPAM
	// (kubenode.Config.LocalAPI, KeepPodIPs), and the overlay adds
	// components/node-dns, which the edge nodes' kubelets give pods as
	// their nameserver, and components/apiserver-via-hub.
	Autonomy bool
	// HubOnlyUnits are units of Units whose nodes reach kube-apiserver
	// only through the hub (with Autonomy): each runs atoll-edge as the
	// host service deploy/host/atoll-edge.service says, enrolled with a
	// bootstrap token from `atoll node enroll`, its local API endpoint
	// with --apiserver-via=hub, its own packets to kube-apiserver
	// dropped, its kubelet registering the node with its unit and
	// atoll.io/agent=host. They join once atoll-cloud serves, as an
	// operator adds such a site.
	HubOnlyUnits []string
	// Audit has kube-apiserver log every request of the edge nodes
	// (system:node:<name>) and of atoll-cloud's ServiceAccount, and every
	// write to Nodes, Endpoints and EndpointSlices, to Bed.AuditLog
	// (kubetest.Audit).
	Audit bool
	// HubMonitor serves nats-server's monitoring on port HubMonitorPort
	// of every hub pod (the embedded hub with --hub-monitor-listen; the
	// external servers serve it already), for a checker to read.
	HubMonitor bool
	// StateDiskSize gives each edge node's /var/lib/atoll a filesystem
	// of its own of that size (kubenode.Config.StateDiskSize), which a
	// test can fill.
	StateDiskSize string
	// Logger receives progress (nil: discarded).
	Logger *slog.Logger
}

// AdminToken is the installation's admin endpoints token (the Secret
// atoll-admin-token).
const AdminToken = "podbed-admin-token-0123456789"

// Namespace is where the overlays install Atoll.
const Namespace = "atoll-system"

// CloudNode is the name of the node atoll-cloud runs on (the first one,
// with ShapeHA).
const CloudNode = "cloud-1"

// Shapes of Options.Shape: the overlays of deploy/overlays.
const (
	ShapeEmbedded = "embedded-hub"
	ShapeHA       = "ha"
)

// cloudNodes are the cloud nodes of each shape.
var cloudNodes = map[string][]string{ShapeEmbedded: {CloudNode}, ShapeHA: {CloudNode, "cloud-2"}}

// Ports of components/hub-nodeport.
const (
	LeafNodePort   = "30742"
	ClientNodePort = "30422"
)

// Bed is a running installation.
type Bed struct {
	Cluster *kubetest.Cluster
	Fleet   *kubenode.Fleet
	// Cloud is the node atoll-cloud runs on (the first of Clouds, the
	// cloud nodes); Edges the edge nodes by name, Unit their units.
	Cloud  *kubenode.Node
	Clouds []*kubenode.Node
	Edges  map[string]*kubenode.Node
	Unit   map[string]string
	// Overlay is the directory of the user's overlay that was applied.
	Overlay string
	// KubectlPath is kubectl's path; AtollCLI the atoll CLI's, AtollEnv
	// the environment that points it at the hub with an operator's
	// credentials (atoll-cloud operator-creds).
	KubectlPath string
	AtollCLI    string
	AtollEnv    []string

	opts     Options
	log      *slog.Logger
	cloudCLI string

	// hostFiles are what each hub-only node's /etc/atoll holds at its
	// first boot (file name: content).
	hostFiles map[string]map[string][]byte
}

// Start installs Atoll as Options say and returns once every pod of it
// is Ready and `atoll status` says SAFE. On error it returns what it
// started too (nil if nothing), for Diagnostics: Stop it.
func Start(ctx context.Context, o Options) (*Bed, error) {
	if o.GracePeriod == 0 {
		o.GracePeriod = 20 * time.Second
	}
	if o.Shape == "" {
		o.Shape = ShapeEmbedded
	}
	if cloudNodes[o.Shape] == nil {
		return nil, fmt.Errorf("podbed: unknown shape %q (%s or %s)", o.Shape, ShapeEmbedded, ShapeHA)
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := kubenode.Prerequisites(); err != nil {
		return nil, err
	}
	kubectl, err := kubetest.Kubectl()
	if err != nil {
		return nil, err
	}
	cfg := kubetest.Config{Dir: filepath.Join(o.Dir, "cluster"), Logger: log}
	opts := append(kubenode.ClusterOptions(o.Net), kubetest.WithNodeMonitorGracePeriod(o.GracePeriod))
	if o.Audit {
		users := []string{"system:serviceaccount:atoll-system:atoll-cloud"}
		for _, names := range o.Units {
			for _, n := range names {
				users = append(users, "system:node:"+n)
			}
		}
		flags, err := kubetest.Audit(filepath.Join(o.Dir, "audit"), users...)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kubetest.WithAPIServerFlags(flags...))
	}
	for _, opt := range opts {
		opt(&cfg)
	}
	cluster, err := kubetest.StartCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b := &Bed{Cluster: cluster, Edges: map[string]*kubenode.Node{}, Unit: map[string]string{}, KubectlPath: kubectl, opts: o, log: log}
	fleet := kubenode.Config{Net: o.Net, Dir: filepath.Join(o.Dir, "nodes"), DNS: true, StateDiskSize: o.StateDiskSize}
	if len(o.HubOnlyUnits) > 0 && !o.Autonomy {
		return b, errors.New("podbed: hub-only units need Autonomy (the local API endpoint)")
	}
	fleet.LocalAPIViaHub = b.hubOnly
	fleet.HostAgent = b.hostAgent
	fleet.Labels = func(node string) map[string]string {
		if !b.hubOnly(node) {
			return nil
		}
		return map[string]string{wellknown.LabelUnit: b.unitOf(node), corev1.LabelTopologyZone: b.unitOf(node), wellknown.LabelAgent: wellknown.AgentHost}
	}
	if o.Autonomy {
		fleet.LocalAPI, fleet.KeepPodIPs = true, true
		fleet.NodeDNS = func(node string) bool {
			for _, names := range o.Units {
				if slices.Contains(names, node) {
					return true
				}
			}
			return false
		}
	}
	if b.Fleet, err = kubenode.Start(ctx, cluster, fleet); err != nil {
		return b, err
	}
	if err := b.addNodes(ctx); err != nil {
		return b, err
	}
	for _, img := range images.All {
		built, err := images.Build(ctx, img, images.Options{Version: "podbed"})
		if err != nil {
			return b, err
		}
		if err := b.Fleet.PushOCI(ctx, img.Name+":podbed", built); err != nil {
			return b, err
		}
	}
	if err := b.buildTools(ctx); err != nil {
		return b, err
	}
	log.Info("podbed: images pushed", "registry", b.Fleet.Registry())
	if o.Shape == ShapeHA {
		return b, b.installHA(ctx)
	}
	return b, b.install(ctx)
}

// buildTools builds the programs an operator runs beside kubectl (the
// atoll CLI, atoll-cloud for its hub-trust and operator-creds), and, for
// ShapeHA, pushes nats-server as the image nats.
func (b *Bed) buildTools(ctx context.Context) error {
	bin := filepath.Join(b.opts.Dir, "bin")
	pkgs := []string{"github.com/atoll-edge/atoll/services/atoll", "github.com/atoll-edge/atoll/services/atoll-cloud"}
	if b.opts.Shape == ShapeHA {
		pkgs = append(pkgs, "github.com/nats-io/nats-server/v2")
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-trimpath", "-o", bin + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("podbed: build %v: %w\n%s", pkgs, err, out)
	}
	b.AtollCLI, b.cloudCLI = filepath.Join(bin, "atoll"), filepath.Join(bin, "atoll-cloud")
	if b.opts.Shape == ShapeHA {
		return b.Fleet.PushExecutable(ctx, "nats:podbed", filepath.Join(bin, "nats-server"))
	}
	return nil
}

// addNodes starts the cloud node and the edge nodes, labelled.
func (b *Bed) addNodes(ctx context.Context) error {
	for _, name := range cloudNodes[b.opts.Shape] {
		n, err := b.Fleet.Add(ctx, name)
		if err != nil {
			return err
		}
		b.Clouds = append(b.Clouds, n)
		if err := b.label(ctx, name, map[string]string{"node-role.kubernetes.io/control-plane": ""}); err != nil {
			return err
		}
	}
	b.Cloud = b.Clouds[0]
	for _, unit := range slices.Sorted(maps.Keys(b.opts.Units)) {
		if slices.Contains(b.opts.HubOnlyUnits, unit) {
			continue // once atoll-cloud serves: addHubOnly
		}
		for _, name := range b.opts.Units[unit] {
			n, err := b.Fleet.Add(ctx, name)
			if err != nil {
				return err
			}
			b.Edges[name], b.Unit[name] = n, unit
			// The operator guide's step: a unit and a zone of the same
			// name, so that KCM judges each site's outage apart.
			if err := b.label(ctx, name, map[string]string{wellknown.LabelUnit: unit, corev1.LabelTopologyZone: unit}); err != nil {
				return err
			}
		}
	}
	b.log.Info("podbed: nodes Ready", "cloud", len(b.Clouds), "edges", len(b.Edges))
	return nil
}

func (b *Bed) label(ctx context.Context, node string, labels map[string]string) error {
	var parts []string
	for k, v := range labels {
		parts = append(parts, fmt.Sprintf("%q:%q", k, v))
	}
	patch := `{"metadata":{"labels":{` + strings.Join(parts, ",") + `}}}`
	_, err := b.Cluster.Client().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// install applies the user's overlay of embedded-hub and waits for Atoll
// to serve.
func (b *Bed) install(ctx context.Context) error {
	// The default shape: no volume to provide.
	patches := ""
	if b.opts.HubMonitor {
		patches = `  - target: {group: apps, version: v1, kind: StatefulSet, name: atoll-cloud, namespace: atoll-system}
    patch: |-
      - op: add
        path: /spec/template/spec/containers/0/args/-
        value: --hub-monitor-listen=:` + HubMonitorPort + "\n"
	}
	if err := b.writeOverlay(patches); err != nil {
		return err
	}
	begin := time.Now()
	if err := b.apply(ctx); err != nil {
		return err
	}
	if err := b.WaitPodsReady(ctx, "atoll-cloud", 1, 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("podbed: atoll-cloud Ready", "after", time.Since(begin).Round(100*time.Millisecond))

	// An operator's credentials, as the operator guide has it.
	creds, err := b.Kubectl(ctx, "-n", Namespace, "exec", "atoll-cloud-0", "--",
		"/atoll-cloud", "operator-creds", "--identity-dir=/var/lib/atoll/identity", "--name=podbed", "--ttl=24h")
	if err != nil {
		return err
	}
	if err := b.operatorCreds(creds); err != nil {
		return err
	}
	return b.edgesServing(ctx, begin)
}

// HubMonitorPort is where each hub pod serves nats-server's monitoring
// (Options.HubMonitor).
const HubMonitorPort = "8222"

// RoutePassword is the route password of ShapeHA's hub servers.
const RoutePassword = "podbed-route-password-0123456789"

// installHA applies the user's overlay of ha, makes the Secrets its
// header asks for and waits for Atoll to serve.
func (b *Bed) installHA(ctx context.Context) error {
	// A volume per hub server, spread over the cloud nodes.
	for i := range 3 {
		node := b.Clouds[i%len(b.Clouds)].Name
		if err := b.localVolume(ctx, fmt.Sprintf("atoll-hub-data-%d", i), fmt.Sprintf("data-atoll-hub-%d", i), node); err != nil {
			return err
		}
	}
	// The cloud services stay on the cloud nodes.
	if err := b.writeOverlay(`  - patch: |-
      apiVersion: apps/v1
      kind: Deployment
      metadata: {name: atoll-cloud, namespace: atoll-system}
      spec:
        template:
          spec:
            nodeSelector: {node-role.kubernetes.io/control-plane: ""}
`); err != nil {
		return err
	}
	begin := time.Now()
	if err := b.apply(ctx); err != nil {
		return err
	}
	// The Secrets, as the overlay's header makes them.
	identityDir := filepath.Join(b.opts.Dir, "identity")
	trust, err := b.run(ctx, b.cloudCLI, "hub-trust", "--identity-dir", identityDir)
	if err != nil {
		return err
	}
	auth := filepath.Join(b.opts.Dir, "hub-auth")
	if err := os.MkdirAll(auth, 0o700); err != nil {
		return err
	}
	var routes []string
	for i := range 3 {
		routes = append(routes, fmt.Sprintf("nats-route://route:%s@atoll-hub-%d.atoll-hub-cluster.atoll-system.svc:6222", RoutePassword, i))
	}
	cluster := fmt.Sprintf("authorization { user: route, password: %q }\nroutes: [\n  %s\n]\n", RoutePassword, strings.Join(routes, "\n  "))
	if err := os.WriteFile(filepath.Join(auth, "trust.conf"), []byte(trust), 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(auth, "cluster.conf"), []byte(cluster), 0o600); err != nil {
		return err
	}
	if _, err := b.Kubectl(ctx, "-n", Namespace, "create", "secret", "generic", "atoll-cloud-identity", "--from-file="+identityDir); err != nil {
		return err
	}
	if _, err := b.Kubectl(ctx, "-n", Namespace, "create", "secret", "generic", "atoll-hub-auth", "--from-file="+auth); err != nil {
		return err
	}
	if err := b.WaitPodsReady(ctx, "atoll-hub", 3, 5*time.Minute); err != nil {
		return err
	}
	if err := b.WaitPodsReady(ctx, "atoll-cloud", 2, 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("podbed: the hub's servers and atoll-cloud's replicas Ready", "after", time.Since(begin).Round(100*time.Millisecond))
	creds, err := b.run(ctx, b.cloudCLI, "operator-creds", "--identity-dir", identityDir, "--name=podbed", "--ttl=24h")
	if err != nil {
		return err
	}
	if err := b.operatorCreds(creds); err != nil {
		return err
	}
	return b.edgesServing(ctx, begin)
}

// localVolume makes the PersistentVolume name for the claim claim of
// atoll-system: a directory of node, as an administrator of a cluster
// without a provisioner makes one.
func (b *Bed) localVolume(ctx context.Context, name, claim, node string) error {
	dir := filepath.Join(b.opts.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return b.applyManifest(ctx, name+".yaml", fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: %s}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: atoll-system, name: %s}
  local: {path: %s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: [%s]}
`, name, claim, dir, node))
}

// writeOverlay copies deploy/ as a user has it and writes their overlay
// beside it: the shape's overlay, the hub's NodePort, the images in the
// fleet's registry, the edges' hub address (every cloud node's NodePort)
// and the patches given (items of patches:).
func (b *Bed) writeOverlay(patches string) error {
	if err := os.CopyFS(filepath.Join(b.opts.Dir, "deploy"), deploy.Manifests()); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("podbed: copy deploy/: %w", err)
	}
	b.Overlay = filepath.Join(b.opts.Dir, "my-atoll")
	if err := os.MkdirAll(b.Overlay, 0o755); err != nil {
		return err
	}
	var urls []string
	for _, n := range b.Clouds {
		urls = append(urls, "nats-leaf://"+n.IP+":"+LeafNodePort)
	}
	reg := b.Fleet.Registry()
	components, images := "../deploy/components/hub-nodeport", ""
	if b.opts.Autonomy {
		// CoreDNS as tools/dns builds it, pushed by the fleet.
		components += ", ../deploy/components/node-dns, ../deploy/components/apiserver-via-hub"
		ref := b.Fleet.Image("coredns")
		i := strings.LastIndex(ref, ":")
		images = fmt.Sprintf("  - {name: coredns/coredns, newName: %s, newTag: %s}\n", ref[:i], ref[i+1:])
	}
	return os.WriteFile(filepath.Join(b.Overlay, "kustomization.yaml"), fmt.Appendf(nil, `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../deploy/overlays/%[1]s]
components: [%[5]s]
images:
  - {name: ghcr.io/atoll-edge/atoll-cloud, newName: %[2]s/atoll-cloud, newTag: podbed}
  - {name: ghcr.io/atoll-edge/atoll-edge, newName: %[2]s/atoll-edge, newTag: podbed}
  - {name: nats, newName: %[2]s/nats, newTag: podbed}
%[6]spatches:
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: atoll-edge, namespace: atoll-system}
      spec:
        template:
          spec:
            containers:
              - name: atoll-edge
                env:
                  - {name: ATOLL_HUB_URL, value: "%[3]s"}
%[4]s`, b.opts.Shape, reg, strings.Join(urls, ","), patches, components, images), 0o644)
}

// apply applies the user's overlay and creates the admin token's Secret.
func (b *Bed) apply(ctx context.Context) error {
	if _, err := b.Kubectl(ctx, "apply", "--server-side", "-k", b.Overlay); err != nil {
		return err
	}
	_, err := b.Kubectl(ctx, "-n", Namespace, "create", "secret", "generic", "atoll-admin-token", "--from-literal=token="+AdminToken)
	return err
}

// run runs a program and returns its standard output; an error carries
// its standard error.
func (b *Bed) run(ctx context.Context, prog string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, prog, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", filepath.Base(prog), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// operatorCreds points the atoll CLI at the hub's client NodePort with
// creds.
func (b *Bed) operatorCreds(creds string) error {
	credsFile := filepath.Join(b.opts.Dir, "operator.creds")
	if err := os.WriteFile(credsFile, []byte(creds), 0o600); err != nil {
		return err
	}
	b.AtollEnv = []string{"ATOLL_NATS_URL=nats://" + b.Cloud.IP + ":" + ClientNodePort, "ATOLL_NATS_CREDS=" + credsFile}
	return nil
}

// edgesServing waits for every agent, points the edge nodes' kube-proxies
// at them and waits for `atoll status` to say SAFE.
func (b *Bed) edgesServing(ctx context.Context, begin time.Time) error {
	// No enrollment step: each agent proves its node with its pod's
	// ServiceAccount token. (Those that started before atoll-cloud wrote
	// the shared enrollment credentials wait until they are there.)
	if err := b.addHubOnly(ctx); err != nil {
		return err
	}
	daemons := 0
	for name := range b.Edges {
		if !b.hubOnly(name) {
			daemons++
		}
	}
	if err := b.WaitPodsReady(ctx, "atoll-edge", daemons, 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("podbed: every atoll-edge Ready", "after", time.Since(begin).Round(100*time.Millisecond))
	if b.opts.Autonomy {
		if err := b.WaitPodsReady(ctx, "atoll-node-dns", len(b.Edges), 3*time.Minute); err != nil {
			return err
		}
	}
	for _, n := range b.Edges {
		if err := n.SetProxyAPIServer("http://127.0.0.1:9471"); err != nil {
			return err
		}
	}
	return b.WaitSafe(ctx, time.Minute)
}

// Units are the edge nodes by unit, as Options gave them.
func (b *Bed) Units() map[string][]string { return b.opts.Units }

// AuditLog is kube-apiserver's audit log with Options.Audit.
func (b *Bed) AuditLog() string { return kubetest.AuditLog(filepath.Join(b.opts.Dir, "audit")) }

// hubOnly reports whether node is in one of Options.HubOnlyUnits.
func (b *Bed) hubOnly(node string) bool {
	return slices.Contains(b.opts.HubOnlyUnits, b.unitOf(node))
}

// unitOf is the unit Options.Units puts node in ("": none).
func (b *Bed) unitOf(node string) string {
	for unit, names := range b.opts.Units {
		if slices.Contains(names, node) {
			return unit
		}
	}
	return ""
}

// addHubOnly enrolls the nodes of the hub-only units and adds them, as
// an operator adds such a site once Atoll serves: a bootstrap token
// from `atoll node enroll`, the hub's CA bundle (the ConfigMap
// atoll-hub-ca) and the node's environment file in /etc/atoll, then the
// node's boot starts deploy/host/atoll-edge.service.
func (b *Bed) addHubOnly(ctx context.Context) error {
	if len(b.opts.HubOnlyUnits) == 0 {
		return nil
	}
	ca, err := b.Cluster.Client().CoreV1().ConfigMaps(Namespace).Get(ctx, "atoll-hub-ca", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("podbed: the hub's CA bundle: %w", err)
	}
	var urls []string
	for _, n := range b.Clouds {
		urls = append(urls, "nats-leaf://"+n.IP+":"+LeafNodePort)
	}
	b.hostFiles = map[string]map[string][]byte{}
	for _, unit := range b.opts.HubOnlyUnits {
		for _, name := range b.opts.Units[unit] {
			// The hub's client NodePort answers once kube-proxy on the
			// cloud node has its endpoint, a moment after atoll-cloud is
			// Ready: the operator tries again.
			file := filepath.Join(b.opts.Dir, name+"-bootstrap.creds")
			wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
			err := poll.Until(wait, func(ctx context.Context) error {
				if out, err := b.Atoll(ctx, "node", "enroll", "--unit", unit, "--out", file, name); err != nil {
					return fmt.Errorf("podbed: atoll node enroll %s: %w: %s", name, err, out)
				}
				return nil
			})
			cancel()
			if err != nil {
				return err
			}
			token, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			b.hostFiles[name] = map[string][]byte{
				"bootstrap.creds": token,
				"hub-ca.crt":      []byte(ca.Data["ca.crt"]),
				// IP: the node's address, known once it is created.
				"atoll-edge.env": fmt.Appendf(nil, "ATOLL_NODE_NAME=%s\nATOLL_HUB_URL=%s\n", name, strings.Join(urls, ",")),
			}
		}
	}
	for _, unit := range b.opts.HubOnlyUnits {
		for _, name := range b.opts.Units[unit] {
			n, err := b.Fleet.Add(ctx, name)
			if err != nil {
				return fmt.Errorf("%w\n%s", err, n.LogTails(30))
			}
			b.Edges[name], b.Unit[name] = n, unit
		}
	}
	b.log.Info("podbed: hub-only nodes Ready", "units", b.opts.HubOnlyUnits)
	return nil
}

// hostAgent is kubenode's HostAgent: on a hub-only node, the command
// line of deploy/host/atoll-edge.service with the environment its
// EnvironmentFile holds, as systemd starts it. The node's /etc/atoll
// gets its files at the first boot.
func (b *Bed) hostAgent(n *kubenode.Node) ([]string, []string, error) {
	if !b.hubOnly(n.Name) {
		return nil, nil, nil
	}
	unit, err := deploy.ReadHostUnit("atoll-edge.service")
	if err != nil {
		return nil, nil, err
	}
	etc := n.HostPath("/etc/atoll")
	for name, content := range b.hostFiles[n.Name] {
		f := filepath.Join(etc, name)
		if name == "atoll-edge.env" {
			content = fmt.Appendf(content, "ATOLL_INTERNAL_IP=%s\n", n.IP)
		}
		if _, err := os.Stat(f); err == nil {
			continue
		}
		if err := os.WriteFile(f, content, 0o600); err != nil {
			return nil, nil, err
		}
	}
	envFile, err := os.ReadFile(n.HostPath(unit.EnvironmentFile))
	if err != nil {
		return nil, nil, fmt.Errorf("podbed: the environment of atoll-edge.service: %w", err)
	}
	env, err := deploy.ParseEnv(envFile)
	if err != nil {
		return nil, nil, fmt.Errorf("podbed: %s: %w", unit.EnvironmentFile, err)
	}
	return unit.Exec[1:], env, nil
}

// WaitSafe waits until `atoll status` says SAFE, at most timeout.
func (b *Bed) WaitSafe(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return poll.Until(ctx, func(ctx context.Context) error {
		out, err := b.Atoll(ctx, "status", "--exit-code")
		if err != nil || !strings.HasPrefix(out, "SAFE") {
			return fmt.Errorf("atoll status: %v\n%s", err, out)
		}
		return nil
	})
}

// Kubectl runs kubectl with the cluster's admin kubeconfig and returns its
// standard output; an error carries its standard error.
func (b *Bed) Kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.KubectlPath, append([]string{"--kubeconfig", b.Cluster.KubeconfigPath()}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Atoll runs the atoll CLI against the installation and returns its
// combined output.
func (b *Bed) Atoll(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, b.AtollCLI, args...)
	cmd.Env = append(os.Environ(), b.AtollEnv...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Apply applies a manifest with kubectl (server-side).
func (b *Bed) Apply(ctx context.Context, manifest string) error {
	return b.applyManifest(ctx, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()), manifest)
}

func (b *Bed) applyManifest(ctx context.Context, name, manifest string) error {
	f := filepath.Join(b.opts.Dir, name)
	if err := os.WriteFile(f, []byte(manifest), 0o600); err != nil {
		return err
	}
	_, err := b.Kubectl(ctx, "apply", "--server-side", "-f", f)
	return err
}

// WaitPodsReady waits until n pods of atoll-system with the name label
// app are Ready.
func (b *Bed) WaitPodsReady(ctx context.Context, app string, n int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return poll.Until(ctx, func(ctx context.Context) error {
		if err := b.Fleet.Exited(); err != nil {
			return poll.Permanent(err)
		}
		pods, err := b.Cluster.Client().CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
		if err != nil {
			return err
		}
		ready := 0
		var not []string
		for _, p := range pods.Items {
			if PodReady(&p) && p.DeletionTimestamp == nil {
				ready++
			} else {
				not = append(not, fmt.Sprintf("%s on %s: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses))
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d %s pods Ready; not: %v", ready, n, app, not)
		}
		return nil
	})
}

// PodReady reports whether p's Ready condition is True.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Diagnostics are what to look at when something went wrong: the pods,
// the nodes' readiness, taints and annotations, `atoll status -o wide`,
// atoll-cloud's and the agents' last log lines.
func (b *Bed) Diagnostics() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	section := func(title string, s string, err error) {
		fmt.Fprintf(&out, "--- %s ---\n%s", title, s)
		if err != nil {
			fmt.Fprintf(&out, "(%v)\n", err)
		}
	}
	s, err := b.Kubectl(ctx, "get", "pods", "-A", "-o", "wide")
	section("pods", s, err)
	s, err = b.Kubectl(ctx, "get", "nodes", "-o", "custom-columns=NAME:.metadata.name,READY:.status.conditions[?(@.type=='Ready')].status,TAINTS:.spec.taints,ANNOTATIONS:.metadata.annotations")
	section("nodes", s, err)
	if b.AtollCLI != "" {
		s, err = b.Atoll(ctx, "status", "-o", "wide")
		section("atoll status -o wide", s, err)
	}
	s, err = b.Kubectl(ctx, "-n", Namespace, "logs", "--tail=60", "--prefix", "-l", "app.kubernetes.io/name=atoll-cloud")
	section("atoll-cloud logs", s, err)
	if b.opts.Shape == ShapeHA {
		s, err = b.Kubectl(ctx, "-n", Namespace, "logs", "--tail=30", "--prefix", "-l", "app.kubernetes.io/name=atoll-hub")
		section("atoll-hub logs", s, err)
	}
	s, err = b.Kubectl(ctx, "-n", Namespace, "logs", "--tail=30", "--prefix", "-l", "app.kubernetes.io/name=atoll-edge")
	section("atoll-edge logs", s, err)
	if b.Fleet != nil {
		for _, n := range b.Fleet.Nodes() {
			out.WriteString(n.LogTails(30))
		}
	}
	return out.String()
}

// Stop stops the fleet and the control plane; their state stays in Dir.
// It fails when a process of a node survives the fleet's stop.
func (b *Bed) Stop() error {
	var err error
	if b.Fleet != nil {
		err = b.Fleet.Stop()
	}
	if b.Cluster != nil {
		_ = b.Cluster.Stop()
	}
	return err
}
