// Package podbed installs Atoll as a user installs it, on real nodes
// (test/kubenode): a kubetest control plane, a fleet of real nodes (one
// cloud node labelled control-plane, the edge nodes labelled with their
// units), Atoll's images built by deploy/images in the fleet's registry,
// and an overlay of the user's own — deploy/overlays/embedded-hub with
// components/hub-nodeport, the images and the edges' hub address — applied
// with `kubectl apply --server-side -k`. The embedded hub's volume is a
// local PersistentVolume on the cloud node. The agents enroll by
// themselves; each edge node's kube-proxy reads its agent's endpoints
// proxy. It serves test/integration/install and the demo's --real-nodes.
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
	// Logger receives progress (nil: discarded).
	Logger *slog.Logger
}

// AdminToken is the installation's admin endpoints token (the Secret
// atoll-admin-token).
const AdminToken = "podbed-admin-token-0123456789"

// CloudNode is the name of the node atoll-cloud runs on.
const CloudNode = "cloud-1"

// Ports of components/hub-nodeport.
const (
	LeafNodePort   = "30742"
	ClientNodePort = "30422"
)

// Bed is a running installation.
type Bed struct {
	Cluster *kubetest.Cluster
	Fleet   *kubenode.Fleet
	// Cloud is the node atoll-cloud runs on; Edges the edge nodes by name,
	// Unit their units.
	Cloud *kubenode.Node
	Edges map[string]*kubenode.Node
	Unit  map[string]string
	// Overlay is the directory of the user's overlay that was applied.
	Overlay string
	// KubectlPath is kubectl's path; AtollCLI the atoll CLI's, AtollEnv
	// the environment that points it at the hub with an operator's
	// credentials (atoll-cloud operator-creds).
	KubectlPath string
	AtollCLI    string
	AtollEnv    []string

	opts Options
	log  *slog.Logger
}

// Start installs Atoll as Options say and returns once every pod of it
// is Ready and `atoll status` says SAFE. On error it returns what it
// started too (nil if nothing), for Diagnostics: Stop it.
func Start(ctx context.Context, o Options) (*Bed, error) {
	if o.GracePeriod == 0 {
		o.GracePeriod = 20 * time.Second
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
	for _, opt := range append(kubenode.ClusterOptions(o.Net), kubetest.WithNodeMonitorGracePeriod(o.GracePeriod)) {
		opt(&cfg)
	}
	cluster, err := kubetest.StartCluster(ctx, cfg)
	if err != nil {
		return nil, err
	}
	b := &Bed{Cluster: cluster, Edges: map[string]*kubenode.Node{}, Unit: map[string]string{}, KubectlPath: kubectl, opts: o, log: log}
	if b.Fleet, err = kubenode.Start(ctx, cluster, kubenode.Config{Net: o.Net, Dir: filepath.Join(o.Dir, "nodes")}); err != nil {
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
	log.Info("podbed: images pushed", "registry", b.Fleet.Registry())
	return b, b.install(ctx)
}

// addNodes starts the cloud node and the edge nodes, labelled.
func (b *Bed) addNodes(ctx context.Context) error {
	var err error
	if b.Cloud, err = b.Fleet.Add(ctx, CloudNode); err != nil {
		return err
	}
	if err := b.label(ctx, CloudNode, map[string]string{"node-role.kubernetes.io/control-plane": ""}); err != nil {
		return err
	}
	for _, unit := range slices.Sorted(maps.Keys(b.opts.Units)) {
		for _, name := range b.opts.Units[unit] {
			n, err := b.Fleet.Add(ctx, name)
			if err != nil {
				return err
			}
			b.Edges[name], b.Unit[name] = n, unit
			if err := b.label(ctx, name, map[string]string{wellknown.LabelUnit: unit}); err != nil {
				return err
			}
		}
	}
	b.log.Info("podbed: nodes Ready", "cloud", CloudNode, "edges", len(b.Edges))
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

// install applies the user's overlay and waits for Atoll to serve.
func (b *Bed) install(ctx context.Context) error {
	// The embedded hub's volume: a local PersistentVolume on the cloud
	// node, as an administrator of a cluster without a provisioner makes.
	store := filepath.Join(b.opts.Dir, "atoll-store")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return err
	}
	if err := b.applyManifest(ctx, "pv.yaml", fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: atoll-store}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  claimRef: {namespace: atoll-system, name: store-atoll-cloud-0}
  local: {path: %s}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: kubernetes.io/hostname, operator: In, values: [%s]}
`, store, CloudNode)); err != nil {
		return err
	}
	// deploy/ as a user has it, and an overlay of theirs beside it.
	if err := os.CopyFS(filepath.Join(b.opts.Dir, "deploy"), deploy.Manifests()); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("podbed: copy deploy/: %w", err)
	}
	b.Overlay = filepath.Join(b.opts.Dir, "my-atoll")
	if err := os.MkdirAll(b.Overlay, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.Overlay, "kustomization.yaml"), fmt.Appendf(nil, `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [../deploy/overlays/embedded-hub]
components: [../deploy/components/hub-nodeport]
images:
  - {name: ghcr.io/atoll-edge/atoll-cloud, newName: %[1]s/atoll-cloud, newTag: podbed}
  - {name: ghcr.io/atoll-edge/atoll-edge, newName: %[1]s/atoll-edge, newTag: podbed}
patches:
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
                  - {name: ATOLL_HUB_URL, value: "nats-leaf://%[2]s:%[3]s"}
`, b.Fleet.Registry(), b.Cloud.IP, LeafNodePort), 0o644); err != nil {
		return err
	}
	begin := time.Now()
	if _, err := b.Kubectl(ctx, "apply", "--server-side", "-k", b.Overlay); err != nil {
		return err
	}
	if _, err := b.Kubectl(ctx, "-n", "atoll-system", "create", "secret", "generic", "atoll-admin-token", "--from-literal=token="+AdminToken); err != nil {
		return err
	}
	if err := b.WaitPodsReady(ctx, "atoll-cloud", 1, 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("podbed: atoll-cloud Ready", "after", time.Since(begin).Round(100*time.Millisecond))

	// An operator's credentials, as the operator guide has it.
	creds, err := b.Kubectl(ctx, "-n", "atoll-system", "exec", "atoll-cloud-0", "--",
		"/atoll-cloud", "operator-creds", "--identity-dir=/var/lib/atoll/identity", "--name=podbed", "--ttl=24h")
	if err != nil {
		return err
	}
	credsFile := filepath.Join(b.opts.Dir, "operator.creds")
	if err := os.WriteFile(credsFile, []byte(creds), 0o600); err != nil {
		return err
	}
	b.AtollCLI = filepath.Join(b.opts.Dir, "atoll")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", b.AtollCLI, "github.com/atoll-edge/atoll/services/atoll").CombinedOutput(); err != nil {
		return fmt.Errorf("podbed: build atoll: %w\n%s", err, out)
	}
	b.AtollEnv = []string{"ATOLL_NATS_URL=nats://" + b.Cloud.IP + ":" + ClientNodePort, "ATOLL_NATS_CREDS=" + credsFile}

	// No enrollment step: each agent proves its node with its pod's
	// ServiceAccount token. (Those that started before atoll-cloud wrote
	// the shared enrollment credentials restart until they are there.)
	if err := b.WaitPodsReady(ctx, "atoll-edge", len(b.Edges), 5*time.Minute); err != nil {
		return err
	}
	b.log.Info("podbed: every atoll-edge Ready", "after", time.Since(begin).Round(100*time.Millisecond))
	for _, n := range b.Edges {
		if err := n.SetProxyAPIServer("http://127.0.0.1:9471"); err != nil {
			return err
		}
	}
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return poll.Until(wait, func(ctx context.Context) error {
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
		pods, err := b.Cluster.Client().CoreV1().Pods("atoll-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + app})
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
	s, err = b.Kubectl(ctx, "-n", "atoll-system", "logs", "--tail=60", "atoll-cloud-0")
	section("atoll-cloud-0 log", s, err)
	s, err = b.Kubectl(ctx, "-n", "atoll-system", "logs", "--tail=30", "--prefix", "-l", "app.kubernetes.io/name=atoll-edge")
	section("atoll-edge logs", s, err)
	if b.Fleet != nil {
		for _, n := range b.Fleet.Nodes() {
			out.WriteString(n.LogTails(30))
		}
	}
	return out.String()
}

// Stop stops the fleet and the control plane; their state stays in Dir.
func (b *Bed) Stop() {
	if b.Fleet != nil {
		b.Fleet.Stop()
	}
	if b.Cluster != nil {
		_ = b.Cluster.Stop()
	}
}
