package install_test

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/podbed"
	"github.com/atoll-edge/atoll/test/poll"
)

// fleetNet is this package's kubenode fleet (bridge kn5).
const fleetNet = 5

// grace is KCM's node monitor grace period here: a node whose kubelet
// stops reporting is Unknown (and tainted unreachable) after it.
const grace = 20 * time.Second

// TestAtollAsPods installs Atoll as a user does, on real nodes: the images
// built by deploy/images in the fleet's registry, the embedded-hub overlay
// with the hub-nodeport component applied with `kubectl apply
// --server-side -k` (leaf links over TLS with atoll-cloud's generated
// certificate), the hub's store in the pod (no volume: the cluster has
// no provisioner, and the default shape needs none). A control-plane node
// runs atoll-cloud; units a (three nodes) and b (one) run atoll-edge,
// which enrolls by itself (its pod's ServiceAccount token); unit h's
// three nodes reach kube-apiserver only through the hub (their own
// packets to it dropped): they join once atoll-cloud serves, atoll-edge
// run as deploy/host/atoll-edge.service runs it, enrolled with a token
// of `atoll node enroll`, their local API endpoint with
// --apiserver-via=hub, which atoll-cloud relays
// (components/apiserver-via-hub); `atoll status` runs with an
// operator's credentials issued by `atoll-cloud operator-creds` through
// kubectl exec; each edge node's kube-proxy reads the agent's endpoints
// proxy. Then:
//   - every pod is Ready, every node holds credentials of its own,
//     `atoll status` says SAFE; unit h's nodes have no direct way to
//     kube-apiserver and no atoll-edge pod;
//   - an enrollment with another node's pod token is refused, with the
//     reason, and counted;
//   - a DeploymentGrid's pods run on the real kubelets and answer through
//     their ServiceGrid's Service, from a pod of the same unit, only with
//     that unit's pods;
//   - a DeploymentGrid whose image is missing from the registry says so
//     in each unit's status, naming the image;
//   - atoll-cloud's pod deleted: the new one starts on a new store, with
//     the identity keys from their Secret (the operator's and the nodes'
//     credentials still work), every agent gets its key recorded again,
//     and `atoll status` says SAFE; the scenarios below run on that store;
//   - scenario 1, a node's link to the cloud silently cut while its peers
//     reach it: KCM loses it, Atoll keeps it (no NoExecute taint in any
//     watch event, its pod's endpoint ready at every poll) and its real
//     pod keeps answering its peers;
//   - unit a cut off from the cloud and every node of it powered off and
//     booted while cut (each node runs the local API endpoint before its
//     kubelet, atoll-ipam as its pods' IPAM and the node DNS): every pod
//     of the unit (the web pods with their ConfigMap, Secret and
//     projected token volumes) runs again at the address it had, a web pod reaches the
//     unit's Service by its DNS name and its ClusterIP, answered in the
//     unit; back online, nothing was evicted or tainted unreachable, every
//     pod is Ready at its address, none restarts again, and the kubelets
//     and atoll-cloud write no storm (audit log: each object but a Lease
//     at most maxWritesAfterHeal times in the half minute after);
//   - the same with unit h, whose only way to kube-apiserver is the hub;
//   - scenario 2, a node powered off: its peers see it dead, KCM taints
//     it, its pod is evicted (deleted; the object stays Terminating, as
//     on any dead node) and the Deployment's replacement runs in the same
//     unit;
//   - a node whose containerd dies: its kubelet reports it not ready, Atoll
//     leaves it to Kubernetes (though its peers see the kubelet answer),
//     its pods are evicted and the unit's Service answers from the others.
func TestAtollAsPods(t *testing.T) {
	if err := kubenode.Prerequisites(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	inst := install(ctx, t, podbed.Options{Net: fleetNet, Autonomy: true, Audit: true,
		Units:        map[string][]string{"a": {"edge-a1", "edge-a2", "edge-a3"}, "b": {"edge-b1"}, "h": {"edge-h1", "edge-h2", "edge-h3"}},
		HubOnlyUnits: []string{"h"}})
	bed, client := inst.bed, inst.client
	nodes, units, cloud := bed.Edges, bed.Unit, bed.Cloud
	t.Logf("atoll status:\n%s", inst.atollStatus())
	// components/apiserver-via-hub: the kubelet expanded the kubernetes
	// Service's address into atoll-cloud's --tunnel-apiserver.
	if k, err := client.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if logs, err := bed.Kubectl(ctx, "-n", "atoll-system", "logs", "atoll-cloud-0"); err != nil ||
		!strings.Contains(logs, "relaying nodes' connections to kube-apiserver") || !strings.Contains(logs, net.JoinHostPort(k.Spec.ClusterIP, "443")) {
		t.Errorf("atoll-cloud does not relay nodes' connections to kube-apiserver at %s: %v\n%s", net.JoinHostPort(k.Spec.ClusterIP, "443"), err, grepLines(logs, "kube-apiserver"))
	}
	inst.otherNodesToken(nodes["edge-a1"], "edge-b1", cloud)
	inst.onlyThroughTheHub("h")
	// The leaf links run TLS: the hub's leaf port asks for it, and the
	// agents (Ready, linked) verify it with the published CA bundle.
	if info := leafInfo(ctx, t, cloud.IP+":"+podbed.LeafNodePort); !strings.Contains(info, `"tls_required":true`) {
		t.Errorf("the hub's leaf port does not require TLS: %s", info)
	}
	if _, err := client.CoreV1().ConfigMaps("atoll-system").Get(ctx, "atoll-hub-ca", metav1.GetOptions{}); err != nil {
		t.Errorf("the hub's CA bundle: %v", err)
	}

	// The workload: one hello per node of unit a, one in unit b.
	inst.apply(webGrid(bed.Fleet.Image("hello"), 3, `
  overrides:
    - units: [b]
      replicas: 1`))
	web := inst.waitWeb(map[string]string{"edge-a1": "a", "edge-a2": "a", "edge-a3": "a", "edge-b1": "b",
		"edge-h1": "h", "edge-h2": "h", "edge-h3": "h"})
	svc := inst.serviceIP("web-svc")
	client2 := web["edge-a2"]
	inst.eventually(time.Minute, func() error { return inst.servedInUnit(client2, svc, "web-a-") })

	t.Run("image missing from the registry", func(t *testing.T) {
		image := bed.Fleet.Registry() + "/not-pushed:v1"
		inst.apply(`apiVersion: apps.atoll.io/v1alpha1
kind: DeploymentGrid
metadata: {name: missing, namespace: default}
spec:
  gridUniqKey: atoll.io/unit
  template:
    replicas: 1
    selector: {matchLabels: {app: missing}}
    template:
      metadata: {labels: {app: missing}}
      spec:
        containers: [{name: app, image: ` + image + `}]
`)
		// The grid says, per unit, which image its pods cannot pull.
		var out string
		eventually(ctx, t, 2*time.Minute, func() error {
			var err error
			out, err = bed.Kubectl(ctx, "get", "deploymentgrid", "missing", "-o", "jsonpath={range .status.units[*]}{.name}={.problem}{\"\\n\"}{end}")
			if err != nil {
				return err
			}
			for _, unit := range []string{"a", "b"} {
				if !strings.Contains(out, unit+"=1/1 pods ErrImagePull") && !strings.Contains(out, unit+"=1/1 pods ImagePullBackOff") ||
					!strings.Contains(out, image) {
					return fmt.Errorf("grid missing's units do not name the image they cannot pull:\n%s", out)
				}
			}
			return nil
		})
		t.Logf("grid missing:\n%s", out)
		if _, err := bed.Kubectl(ctx, "delete", "deploymentgrid", "missing"); err != nil {
			t.Error(err)
		}
	})

	t.Run("a new atoll-cloud pod: a new store", func(t *testing.T) {
		if _, err := bed.Kubectl(ctx, "-n", "atoll-system", "delete", "pod", "atoll-cloud-0", "--wait=true"); err != nil {
			t.Fatal(err)
		}
		deleted := time.Now()
		if err := bed.WaitPodsReady(ctx, "atoll-cloud", 1, 3*time.Minute); err != nil {
			t.Fatal(err)
		}
		ready := time.Since(deleted)
		want := fmt.Sprintf("atoll_identity_nodes_reregistered_total %d", len(nodes))
		inst.eventually(2*time.Minute, func() error {
			if m := inst.cloudMetrics(); !strings.Contains(m, want) {
				return fmt.Errorf("want %s: %s", want, grepLines(m, "atoll_identity_nodes_reregistered_total"))
			}
			return nil
		})
		if err := bed.WaitSafe(ctx, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		safe := time.Since(deleted)
		t.Logf("new atoll-cloud pod Ready %s and SAFE %s after the old one was deleted; every node's key recorded again",
			ready.Round(100*time.Millisecond), safe.Round(100*time.Millisecond))
	})

	t.Run("scenario 1: link cut, peers healthy", func(t *testing.T) {
		a1 := nodes["edge-a1"]
		taints := watchNoExecute(ctx, t, client, a1.Name)
		if err := a1.Cut(kubenode.HostIP(fleetNet), cloud.IP, cloud.PodCIDR); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := a1.Heal(); err != nil {
				t.Error(err)
			}
		}()
		cut := time.Now()
		inst.lostByKCM(t, a1.Name, cut)
		polls := inst.keptThroughCut(t, web["edge-a1"], client2, svc, "web-a-")
		if !inst.protected(a1.Name) {
			t.Errorf("atoll status does not show %s protected:\n%s", a1.Name, inst.atollStatus())
		}
		t.Logf("agents' (and local API endpoints') resident memory with the cut: %s", agentsRSS(t))
		if got := taints(); len(got) > 0 {
			t.Errorf("%s got NoExecute taints while its peers saw it healthy: %v", a1.Name, got)
		}
		t.Logf("%d polls over %s of the cut: pod kept, endpoint ready, answering", polls, time.Since(cut).Round(time.Second))
	})

	t.Run("unit cut off and rebooted", func(t *testing.T) {
		// A StatefulSetGrid too: its pod in unit a answers at its
		// unit-local name (db-0.db-svc…, atoll-edge's hosts file).
		inst.apply(dbGrid(bed.Fleet.Image("hello")))
		inst.eventually(3*time.Minute, func() error {
			pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=db"})
			if err != nil {
				return err
			}
			ready := 0
			for _, p := range pods.Items {
				if podbed.PodReady(&p) {
					ready++
				}
			}
			if ready != 3 {
				return fmt.Errorf("%d of 3 db pods Ready (one per unit)", ready)
			}
			return nil
		})
		inst.cutOffAndRebooted(t, "a", client2, map[string]string{
			"http://web-svc.default.svc.cluster.local/": "hello from web-a-",
			"http://web-svc/":     "hello from web-a-",
			"http://" + svc + "/": "hello from web-a-",
			"http://db-0.db-svc.default.svc.cluster.local:8080/": "hello from db-a-0",
		})
	})

	t.Run("unit through the hub cut off and rebooted", func(t *testing.T) {
		// The same, on nodes whose only way to kube-apiserver is the hub.
		inst.cutOffAndRebooted(t, "h", web["edge-h2"], map[string]string{
			"http://web-svc.default.svc.cluster.local/":          "hello from web-h-",
			"http://" + svc + "/":                                "hello from web-h-",
			"http://db-0.db-svc.default.svc.cluster.local:8080/": "hello from db-h-0",
		})
	})

	t.Run("scenario 2: node dead", func(t *testing.T) {
		a3 := nodes["edge-a3"]
		pod := web["edge-a3"]
		a3.PowerCut()
		off := time.Now()
		eventually(ctx, t, grace+2*time.Minute, func() error {
			// Evicted: being deleted (the object stays until a kubelet
			// confirms, which a dead node never does).
			p, err := client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
			if err == nil && p.DeletionTimestamp == nil {
				return fmt.Errorf("pod %s of the dead node %s not evicted yet", pod.Name, a3.Name)
			}
			pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if p.Name != pod.Name && units[p.Spec.NodeName] == "a" && p.Spec.NodeName != a3.Name &&
					!slices.ContainsFunc(webNames(web), func(n string) bool { return n == p.Name }) && podbed.PodReady(&p) {
					t.Logf("%s's pod evicted; its replacement %s Ready on %s, %s after the power cut", a3.Name, p.Name,
						p.Spec.NodeName, time.Since(off).Round(100*time.Millisecond))
					return nil
				}
			}
			return fmt.Errorf("no replacement of %s Ready in unit a", pod.Name)
		})
		if err := inst.servedInUnit(client2, svc, "web-a-"); err != nil {
			t.Error(err)
		}
	})

	t.Run("container runtime down", func(t *testing.T) {
		a1 := nodes["edge-a1"]
		before, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web", FieldSelector: "spec.nodeName=" + a1.Name})
		if err != nil || len(before.Items) == 0 {
			t.Fatalf("web pods on %s: %v (%d)", a1.Name, err, len(before.Items))
		}
		a1.StopContainerd()
		down := time.Now()
		defer func() {
			if err := a1.StartContainerd(ctx); err != nil {
				t.Error(err)
			}
		}()
		// The kubelet reports the node not ready itself: its peers still
		// see it answer, and Atoll leaves it to Kubernetes, which evicts
		// its pods; the Deployment replaces them in the unit.
		eventually(ctx, t, 2*time.Minute, func() error {
			n, err := client.CoreV1().Nodes().Get(ctx, a1.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return t.Key == corev1.TaintNodeNotReady && t.Effect == corev1.TaintEffectNoExecute
			}) {
				return fmt.Errorf("%s: Ready=%s, taints %v; want not-ready:NoExecute", a1.Name, nodeReady(ctx, client, a1.Name), n.Spec.Taints)
			}
			for _, p := range before.Items {
				got, err := client.CoreV1().Pods("default").Get(ctx, p.Name, metav1.GetOptions{})
				if err == nil && got.DeletionTimestamp == nil {
					return fmt.Errorf("pod %s on %s not evicted yet", p.Name, a1.Name)
				}
			}
			return inst.servedInUnit(client2, svc, "web-a-")
		})
		t.Logf("%s's runtime down: reported not ready, its pods evicted and served from the unit %s later",
			a1.Name, time.Since(down).Round(100*time.Millisecond))
		if inst.protected(a1.Name) {
			t.Errorf("Atoll protects %s, whose kubelet reports it not ready:\n%s", a1.Name, inst.atollStatus())
		}
	})
}

// webGrid is the test's workload: a DeploymentGrid web of replicas hello
// pods per unit, spread over the unit's nodes, each mounting the
// ConfigMap web-config and the Secret web-secret (made with it) besides
// its projected ServiceAccount token, with extra appended to its spec
// (overrides), and its ServiceGrid web (web-svc in each unit).
func webGrid(image string, replicas int, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata: {name: web-config, namespace: default}
data: {greeting: hello}
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret, namespace: default}
stringData: {password: podbed-web-secret}
---
apiVersion: apps.atoll.io/v1alpha1
kind: DeploymentGrid
metadata: {name: web, namespace: default}
spec:
  gridUniqKey: atoll.io/unit
  template:
    replicas: %d
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec:
        affinity:
          podAntiAffinity:
            preferredDuringSchedulingIgnoredDuringExecution:
              - weight: 100
                podAffinityTerm:
                  topologyKey: kubernetes.io/hostname
                  labelSelector: {matchLabels: {app: web}}
        containers:
          - name: web
            image: %s
            ports: [{containerPort: 8080}]
            readinessProbe: {periodSeconds: 1, httpGet: {path: /, port: 8080}}
            volumeMounts:
              - {name: config, mountPath: /etc/web/config}
              - {name: secret, mountPath: /etc/web/secret}
        volumes:
          - {name: config, configMap: {name: web-config}}
          - {name: secret, secret: {secretName: web-secret}}%s
---
apiVersion: apps.atoll.io/v1alpha1
kind: ServiceGrid
metadata: {name: web, namespace: default}
spec:
  gridUniqKey: atoll.io/unit
  template:
    selector: {app: web}
    ports: [{port: 80, targetPort: 8080}]
`, replicas, image, extra)
}

// dbGrid is a StatefulSetGrid db of one hello pod per unit, with its
// headless ServiceGrid db (db-svc in each unit): in each unit
// db-0.db-svc.default.svc.cluster.local names the unit's pod db-<unit>-0.
func dbGrid(image string) string {
	return fmt.Sprintf(`apiVersion: apps.atoll.io/v1alpha1
kind: StatefulSetGrid
metadata: {name: db, namespace: default}
spec:
  gridUniqKey: atoll.io/unit
  template:
    serviceName: db-svc
    replicas: 1
    selector: {matchLabels: {app: db}}
    template:
      metadata: {labels: {app: db}}
      spec:
        containers:
          - name: db
            image: %s
            ports: [{containerPort: 8080}]
            readinessProbe: {periodSeconds: 1, httpGet: {path: /, port: 8080}}
---
apiVersion: apps.atoll.io/v1alpha1
kind: ServiceGrid
metadata: {name: db, namespace: default}
spec:
  gridUniqKey: atoll.io/unit
  template:
    clusterIP: None
    selector: {app: db}
    ports: [{port: 8080}]
`, image)
}

// lostByKCM waits for t until KCM has lost node (Ready Unknown), whose
// link was cut at cut.
func (i *installation) lostByKCM(t *testing.T, node string, cut time.Time) {
	t.Helper()
	eventually(i.ctx, t, grace+30*time.Second, func() error {
		if ready := nodeReady(i.ctx, i.client, node); ready != corev1.ConditionUnknown {
			return fmt.Errorf("node %s Ready=%s, want Unknown (KCM lost it)", node, ready)
		}
		return nil
	})
	t.Logf("KCM lost %s %s after the cut", node, time.Since(cut).Round(100*time.Millisecond))
}

// keptThroughCut checks for t, every second until KCM's unreachable toleration
// and 20 s more have passed, that pod (of a node whose link is cut) is
// kept, its endpoint ready, that it answers client (a pod of a peer) and
// that the Service at svc answers client from its unit (pods named
// prefix*). It returns the number of polls.
func (i *installation) keptThroughCut(t *testing.T, pod, client *corev1.Pod, svc, prefix string) int {
	t.Helper()
	until := time.Now().Add(time.Duration(kubetest.DefaultTolerationSeconds)*time.Second + 20*time.Second)
	polls := 0
	for time.Now().Before(until) {
		p, err := i.client.CoreV1().Pods("default").Get(i.ctx, pod.Name, metav1.GetOptions{})
		if err != nil || p.DeletionTimestamp != nil {
			t.Fatalf("%s's pod %s: %v (deleting %v)", pod.Spec.NodeName, pod.Name, err, p.DeletionTimestamp)
		}
		if err := endpointReady(i.ctx, i.client, pod.Status.PodIP); err != nil {
			t.Fatal(err)
		}
		if out, err := i.exec(client, "http://"+pod.Status.PodIP+":8080/"); err != nil || !strings.Contains(out, pod.Name) {
			t.Fatalf("%s's pod from %s: %v %q", pod.Spec.NodeName, client.Spec.NodeName, err, out)
		}
		if err := i.servedInUnit(client, svc, prefix); err != nil {
			t.Fatal(err)
		}
		polls++
		time.Sleep(time.Second)
	}
	return polls
}

// install installs Atoll as o says (on a fresh directory, KCM's grace
// period grace, progress logged to t), shows the diagnostics if t fails,
// stops it with t, and checks that every edge node holds credentials of
// its own.
func install(ctx context.Context, t *testing.T, o podbed.Options) *installation {
	t.Helper()
	begin := time.Now()
	o.Dir, o.GracePeriod, o.Logger = t.TempDir(), grace, slog.New(slog.NewTextHandler(t.Output(), nil))
	bed, err := podbed.Start(ctx, o)
	if bed != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(bed.Diagnostics())
			}
			if err := bed.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("installed (%s), every pod Ready and atoll status SAFE, %s after the control plane's start",
		cmp.Or(o.Shape, podbed.ShapeEmbedded), time.Since(begin).Round(100*time.Millisecond))
	for name, n := range bed.Edges {
		if _, err := os.Stat(filepath.Join(n.HostPath("/var/lib/atoll"), "node.creds")); err != nil {
			t.Errorf("%s holds no credentials of its own: %v", name, err)
		}
	}
	return &installation{t: t, ctx: ctx, bed: bed, client: bed.Cluster.Client()}
}

// installation checks on the installed cluster.
type installation struct {
	t      *testing.T
	ctx    context.Context
	bed    *podbed.Bed
	client kubernetes.Interface
}

// apply applies a manifest with kubectl.
func (i *installation) apply(manifest string) {
	i.t.Helper()
	if err := i.bed.Apply(i.ctx, manifest); err != nil {
		i.t.Fatal(err)
	}
}

func (i *installation) eventually(timeout time.Duration, check func() error) {
	i.t.Helper()
	eventually(i.ctx, i.t, timeout, check)
}

// eventually polls check until it passes, failing t after timeout.
func eventually(ctx context.Context, t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := poll.Until(ctx, func(context.Context) error { return check() }); err != nil {
		t.Fatal(err)
	}
}

// waitWeb waits until one Ready web pod runs on each node of want (node:
// unit) and returns them by node.
func (i *installation) waitWeb(want map[string]string) map[string]*corev1.Pod {
	i.t.Helper()
	var byNode map[string]*corev1.Pod
	i.eventually(3*time.Minute, func() error {
		pods, err := i.client.CoreV1().Pods("default").List(i.ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return err
		}
		byNode = map[string]*corev1.Pod{}
		for _, p := range pods.Items {
			if podbed.PodReady(&p) {
				byNode[p.Spec.NodeName] = &p
			}
		}
		for node, unit := range want {
			p := byNode[node]
			if p == nil {
				return fmt.Errorf("no Ready web pod on %s (%d pods)", node, len(pods.Items))
			}
			if !strings.HasPrefix(p.Name, "web-"+unit+"-") {
				return fmt.Errorf("pod %s of another unit on %s (unit %s)", p.Name, node, unit)
			}
		}
		return nil
	})
	return byNode
}

func (i *installation) serviceIP(name string) string {
	i.t.Helper()
	var ip string
	i.eventually(time.Minute, func() error {
		s, err := i.client.CoreV1().Services("default").Get(i.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ip = s.Spec.ClusterIP
		return nil
	})
	return ip
}

// exec runs `hello get url` in pod.
func (i *installation) exec(pod *corev1.Pod, url string) (string, error) {
	return i.bed.Kubectl(i.ctx, "-n", pod.Namespace, "exec", pod.Name, "--", "/hello", "get", url)
}

// servedInUnit calls the Service at ip from pod 10 times and fails unless
// every answer comes from a pod whose name starts with prefix (its unit's).
func (i *installation) servedInUnit(pod *corev1.Pod, ip, prefix string) error {
	for range 10 {
		out, err := i.exec(pod, "http://"+ip+"/")
		if err != nil {
			return fmt.Errorf("Service %s from %s on %s: %v %q", ip, pod.Name, pod.Spec.NodeName, err, out)
		}
		if !strings.HasPrefix(out, "hello from "+prefix) {
			return fmt.Errorf("Service %s from %s answered %q, not a pod %s*", ip, pod.Name, out, prefix)
		}
	}
	return nil
}

// watchNoExecute watches node from now on and returns a function that
// lists every NoExecute taint any watch event carried.
func watchNoExecute(ctx context.Context, t *testing.T, client kubernetes.Interface, node string) func() []string {
	t.Helper()
	w, err := client.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			n, ok := ev.Object.(*corev1.Node)
			if !ok || ev.Type == watch.Error {
				continue
			}
			for _, taint := range n.Spec.Taints {
				if taint.Effect == corev1.TaintEffectNoExecute {
					// What the node said then, to tell a taint's cause
					// from the failure alone.
					ready := "Ready missing"
					for _, c := range n.Status.Conditions {
						if c.Type == corev1.NodeReady {
							ready = fmt.Sprintf("Ready=%s (%s, heartbeat %s, since %s)", c.Status, c.Reason,
								c.LastHeartbeatTime.UTC().Format("15:04:05"), c.LastTransitionTime.UTC().Format("15:04:05"))
						}
					}
					mu.Lock()
					seen = append(seen, fmt.Sprintf("%s at rv %s (%s, seen %s, added %v; %s; verdict %q, hold until %q)", taint.Key, n.ResourceVersion, ev.Type,
						time.Now().UTC().Format("15:04:05.000"), taint.TimeAdded, ready,
						n.Annotations[wellknown.AnnotationVerdict], n.Annotations[wellknown.AnnotationHoldUntil]))
					mu.Unlock()
				}
			}
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}
}

func nodeReady(ctx context.Context, client kubernetes.Interface, name string) corev1.ConditionStatus {
	n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// endpointReady fails unless an EndpointSlice of default lists ip ready.
func endpointReady(ctx context.Context, client kubernetes.Interface, ip string) error {
	slices, err := client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if containsAddr(e, ip) {
				if e.Conditions.Ready == nil || !*e.Conditions.Ready {
					return fmt.Errorf("endpoint %s of %s not ready", ip, s.Name)
				}
				return nil
			}
		}
	}
	return fmt.Errorf("no endpoint %s", ip)
}

func containsAddr(e discoveryv1.Endpoint, ip string) bool { return slices.Contains(e.Addresses, ip) }

func webNames(web map[string]*corev1.Pod) []string {
	var names []string
	for _, p := range web {
		names = append(names, p.Name)
	}
	return names
}

// leafInfo is the INFO line a NATS leaf listener at addr greets with.
func leafInfo(ctx context.Context, t *testing.T, addr string) string {
	t.Helper()
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("the hub's leaf port %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("the hub's leaf port %s: %v", addr, err)
	}
	return line
}

// otherNodesToken presents the ServiceAccount token of from's atoll-edge
// pod to enroll node, as a compromised from would: atoll-cloud refuses it
// and counts the refusal.
func (i *installation) otherNodesToken(from *kubenode.Node, node string, cloud *kubenode.Node) {
	t := i.t
	t.Helper()
	pods, err := i.client.CoreV1().Pods("atoll-system").List(i.ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=atoll-edge", FieldSelector: "spec.nodeName=" + from.Name})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("atoll-edge pod of %s: %v (%d)", from.Name, err, len(pods.Items))
	}
	// A token of the kind the kubelet projects into the pod: atoll-edge's,
	// for audience atoll, bound to from's pod.
	pod := pods.Items[0]
	tr, err := i.client.CoreV1().ServiceAccounts("atoll-system").CreateToken(i.ctx, "atoll-edge", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{Audiences: []string{"atoll"},
			BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token
	sec, err := i.client.CoreV1().Secrets("atoll-system").Get(i.ctx, identity.DefaultEnrollSecret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	enrollCreds := filepath.Join(t.TempDir(), "enroll.creds")
	if err := os.WriteFile(enrollCreds, sec.Data[identity.EnrollCredsKey], 0o600); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+cloud.IP+":30422", nats.UserCredentials(enrollCreds),
		nats.CustomInboxPrefix(events.EnrollInboxPrefix(node)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	subj, _ := events.EnrollKubernetesSubject(node)
	req, _ := json.Marshal(events.EnrollRequest{Token: token, Key: pub})
	msg, err := nc.Request(subj, req, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if desc := msg.Header.Get(micro.ErrorHeader); !strings.Contains(desc, "the token is of a pod on node "+from.Name) {
		t.Fatalf("enrolling %s with %s's token: %q %s, want a refusal naming %s", node, from.Name, desc, msg.Data, from.Name)
	}
	if m := i.cloudMetrics(); !strings.Contains(m, `atoll_identity_requests_refused_total{endpoint="enroll-k8s"} 1`) {
		t.Errorf("the refusal is not counted:\n%s", grepLines(m, "atoll_identity_requests_refused_total"))
	}
	t.Logf("enrolling %s with %s's pod token: refused (%s), counted", node, from.Name, msg.Header.Get(micro.ErrorHeader))
}

// cloudMetrics scrapes atoll-cloud's /metrics at its pod's address with
// the admin token.
func (i *installation) cloudMetrics() string {
	i.t.Helper()
	pod, err := i.client.CoreV1().Pods("atoll-system").Get(i.ctx, "atoll-cloud-0", metav1.GetOptions{})
	if err != nil {
		i.t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(i.ctx, http.MethodGet, "http://"+net.JoinHostPort(pod.Status.PodIP, "8080")+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+podbed.AdminToken)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		i.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, substr string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// protected reports whether `atoll status -o json` says Atoll protects
// node.
func (i *installation) protected(node string) bool {
	i.t.Helper()
	out, err := i.bed.Atoll(i.ctx, "status", "-o", "json")
	if err != nil {
		i.t.Fatalf("atoll status -o json: %v\n%s", err, out)
	}
	var st struct {
		Units []struct {
			Nodes []struct {
				Name      string `json:"name"`
				Protected bool   `json:"protected"`
			} `json:"nodes"`
		} `json:"units"`
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		i.t.Fatalf("atoll status -o json: %v\n%s", err, out)
	}
	for _, u := range st.Units {
		for _, n := range u.Nodes {
			if n.Name == node {
				return n.Protected
			}
		}
	}
	i.t.Fatalf("atoll status -o json has no node %s:\n%s", node, out)
	return false
}

// atollStatus is the output of atoll status.
func (i *installation) atollStatus() string {
	out, err := i.bed.Atoll(i.ctx, "status")
	if err != nil {
		return fmt.Sprintf("%s\n(%v)", out, err)
	}
	return out
}

// agentsRSS reads the resident memory of every atoll-edge process of the
// host (the agents of the fleet's nodes, by the NODE_NAME their pod sets).
func agentsRSS(t *testing.T) string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/comm")
	var out []string
	for _, comm := range procs {
		if b, err := os.ReadFile(comm); err != nil || strings.TrimSpace(string(b)) != "atoll-edge" {
			continue
		}
		dir := filepath.Dir(comm)
		env, _ := os.ReadFile(filepath.Join(dir, "environ"))
		node := "?"
		for kv := range strings.SplitSeq(string(env), "\x00") {
			// The DaemonSet's pods and the host services name it so.
			for _, name := range []string{"NODE_NAME=", "ATOLL_NODE_NAME="} {
				if v, ok := strings.CutPrefix(kv, name); ok {
					node = v
				}
			}
		}
		// The nodes' local API endpoints are atoll-edge too.
		if cmd, _ := os.ReadFile(filepath.Join(dir, "cmdline")); strings.Contains(string(cmd), "\x00local-api\x00") {
			node = "local-api"
		}
		status, _ := os.ReadFile(filepath.Join(dir, "status"))
		for line := range strings.SplitSeq(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				out = append(out, node+" "+strings.TrimSpace(v))
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// maxWritesAfterHeal bounds the writes to one object but a Lease (by one
// user) in the half minute after a rebooted unit's link comes back: the
// kubelet reports its pods' and its node's new status and the events
// of the boot, atoll-cloud the grids' status as the pods turn Ready; a
// write storm is many times that. A node's Lease is written as often as
// the kubelet renews it.
const maxWritesAfterHeal = 10

// cutOffAndRebooted cuts every node of unit from the cloud, powers them
// off and boots them while cut, and checks that the unit comes back by
// itself: every pod that ran on its nodes runs again at its address (its
// own containers seen on the node), and client (a pod of the unit)
// reaches the Service web-svc at svc by name and by address, answered by
// the unit's pods; then heals the cut and checks that nothing was
// evicted or tainted, that the apiserver has every pod Ready at its
// address, with no restart after that, and that the writes of the
// unit's nodes and atoll-cloud since the heal are no storm.
func (i *installation) cutOffAndRebooted(t *testing.T, unit string, client *corev1.Pod, urls map[string]string) {
	t.Helper()
	ctx, cloud := i.ctx, i.bed.Cloud
	var members []*kubenode.Node
	for name, n := range i.bed.Edges {
		if i.bed.Unit[name] == unit {
			members = append(members, n)
		}
	}
	// From a settled unit: every node Ready, nothing lost or protected
	// (a scenario before may have just healed).
	eventually(ctx, t, 2*time.Minute, func() error {
		for _, n := range members {
			if r := nodeReady(ctx, i.client, n.Name); r != corev1.ConditionTrue {
				return fmt.Errorf("node %s Ready=%s", n.Name, r)
			}
		}
		return nil
	})
	if err := i.bed.WaitSafe(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	before := map[string]corev1.Pod{} // by UID
	var taints []func() []string
	for _, n := range members {
		pods, err := i.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				before[string(p.UID)] = p
			}
		}
		taints = append(taints, watchNoExecute(ctx, t, i.client, n.Name))
	}
	for _, n := range members {
		if err := n.Cut(kubenode.HostIP(fleetNet), cloud.IP, cloud.PodCIDR); err != nil {
			t.Fatal(err)
		}
	}
	healed := false
	heal := func() {
		if healed {
			return
		}
		healed = true
		for _, n := range members {
			if err := n.Heal(); err != nil {
				t.Error(err)
			}
		}
	}
	defer heal()
	for _, n := range members {
		n.PowerCut()
	}
	off := time.Now()
	for _, n := range members {
		if err := n.Boot(ctx); err != nil {
			t.Fatal(err)
		}
	}
	nodeOf := map[string]*kubenode.Node{}
	for _, n := range members {
		nodeOf[n.Name] = n
	}
	// Every pod runs again, seen on its node; the web pods answer at
	// their addresses.
	wait, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := poll.Until(wait, func(context.Context) error {
		var errs []error
		for uid, p := range before {
			n := nodeOf[p.Spec.NodeName]
			if !n.PodRunning(uid) {
				errs = append(errs, fmt.Errorf("pod %s/%s does not run on %s", p.Namespace, p.Name, n.Name))
				continue
			}
			if p.Labels["app"] != "web" {
				continue
			}
			if out, err := n.Exec(ctx, "curl", "-sS", "--max-time", "2", "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/"); err != nil ||
				!strings.HasPrefix(out, "hello from "+p.Name) {
				errs = append(errs, fmt.Errorf("pod %s at its address %s: %v %q", p.Name, p.Status.PodIP, err, out))
			}
		}
		return errors.Join(errs...)
	}); err != nil {
		for _, n := range members {
			t.Logf("%s", n.LogTails(60))
		}
		t.Fatal(err)
	}
	t.Logf("unit %s cut off and rebooted: its %d pods run again at their addresses %s after the power cut",
		unit, len(before), time.Since(off).Round(100*time.Millisecond))
	// A pod of the unit reaches the unit's Services by name and address.
	n := nodeOf[client.Spec.NodeName]
	for _, url := range slices.Sorted(maps.Keys(urls)) {
		eventually(ctx, t, time.Minute, func() error {
			out, err := n.ExecInPod(ctx, string(client.UID), "/hello", "get", url)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(out, urls[url]) {
				return fmt.Errorf("%s from %s answered %q, want %s… (a pod of unit %s)", url, client.Name, out, urls[url], unit)
			}
			return nil
		})
	}
	t.Logf("while cut off: %s reaches %d Service URLs of unit %s by name and ClusterIP, %s after the power cut",
		client.Name, len(urls), unit, time.Since(off).Round(100*time.Millisecond))

	heal()
	back := time.Now()
	restarts := map[string]int32{}
	eventually(ctx, t, 2*time.Minute, func() error {
		for uid, was := range before {
			p, err := i.client.CoreV1().Pods(was.Namespace).Get(ctx, was.Name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("pod %s/%s: %w", was.Namespace, was.Name, err)
			}
			switch {
			case string(p.UID) != uid || p.DeletionTimestamp != nil:
				return fmt.Errorf("pod %s/%s was evicted or replaced", was.Namespace, was.Name)
			case !podbed.PodReady(p):
				return fmt.Errorf("pod %s/%s on %s not Ready yet", p.Namespace, p.Name, p.Spec.NodeName)
			case p.Status.PodIP != was.Status.PodIP:
				return fmt.Errorf("pod %s/%s at %s, was at %s", p.Namespace, p.Name, p.Status.PodIP, was.Status.PodIP)
			}
			// The status the kubelet reports after the reboot: each
			// container restarted once more.
			var r, before int32
			for _, c := range p.Status.ContainerStatuses {
				r += c.RestartCount
			}
			for _, c := range was.Status.ContainerStatuses {
				before += c.RestartCount + 1
			}
			if r < before {
				return fmt.Errorf("pod %s/%s: %d restarts, the status from before the reboot (want %d)", p.Namespace, p.Name, r, before)
			}
			restarts[uid] = r
		}
		for _, m := range members {
			if r := nodeReady(ctx, i.client, m.Name); r != corev1.ConditionTrue {
				return fmt.Errorf("node %s Ready=%s", m.Name, r)
			}
		}
		return nil
	})
	t.Logf("link back: the apiserver has every pod of unit %s Ready at its address, its reboot counted, %s later", unit, time.Since(back).Round(100*time.Millisecond))
	// The cloud never treated the unit as lost: no unreachable taint. A
	// kubelet that reports its node not ready just after its boot gets
	// Kubernetes' not-ready taint until it reports Ready (Atoll leaves a
	// node's own report to Kubernetes); it is logged, and nothing was
	// evicted (above).
	for j, m := range members {
		var notReady []string
		for _, taint := range taints[j]() {
			if strings.HasPrefix(taint, corev1.TaintNodeUnreachable) {
				t.Errorf("%s got %s while its unit was cut off", m.Name, taint)
			} else {
				notReady = append(notReady, taint)
			}
		}
		if len(notReady) > 0 {
			t.Logf("%s reported itself not ready after its boot: %v", m.Name, notReady)
		}
	}
	// No restart once the link is back: the pods run on as they came
	// back (an observation window, not a wait for a condition).
	time.Sleep(10 * time.Second)
	for uid, was := range before {
		p, err := i.client.CoreV1().Pods(was.Namespace).Get(ctx, was.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var r int32
		for _, c := range p.Status.ContainerStatuses {
			r += c.RestartCount
		}
		if r != restarts[uid] {
			t.Errorf("pod %s/%s restarted after the link came back (%d restarts, %d when it was Ready)", p.Namespace, p.Name, r, restarts[uid])
		}
	}
	// No write storm: what the unit's kubelets and atoll-cloud wrote
	// from the heal on, by object (the audit log).
	window := time.Since(back)
	writes, total := i.writesSince(members, back), 0
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(writes)) {
		total += writes[k]
		lines = append(lines, fmt.Sprintf("%3d %s", writes[k], k))
		limit := maxWritesAfterHeal
		switch {
		case strings.HasSuffix(k, " leases/atoll-system/atoll-cloud"):
			continue // atoll-cloud's leader election, on its own clock
		case strings.Contains(k, " leases/kube-node-lease/"):
			// Renewals, not a fight over the Lease.
			limit = int(window/kubenode.LeaseRenewInterval) + 2
		}
		if writes[k] > limit {
			t.Errorf("%s: %d writes in the %s after the heal (at most %d)", k, writes[k], window.Round(time.Second), limit)
		}
	}
	t.Logf("writes of unit %s's nodes and atoll-cloud in the %s after the heal: %d\n%s", unit, window.Round(time.Second), total, strings.Join(lines, "\n"))
	for url, want := range urls {
		if ip, ok := strings.CutPrefix(url, "http://"); ok && net.ParseIP(strings.TrimSuffix(ip, "/")) != nil {
			if err := i.servedInUnit(client, strings.TrimSuffix(ip, "/"), strings.TrimPrefix(want, "hello from ")); err != nil {
				t.Error(err)
			}
		}
	}
}

// onlyThroughTheHub checks that the nodes of unit reach kube-apiserver
// only through the hub: a direct request from the node is dropped, the
// atoll-edge DaemonSet left them to their host service (no pod there),
// and atoll-cloud relayed their connections.
func (i *installation) onlyThroughTheHub(unit string) {
	t, ctx := i.t, i.ctx
	t.Helper()
	api := i.bed.Cluster.APIServerURL()
	var names []string
	for name, n := range i.bed.Edges {
		if i.bed.Unit[name] != unit {
			continue
		}
		names = append(names, name)
		direct := "https://" + net.JoinHostPort(n.HostIP(), api[strings.LastIndex(api, ":")+1:]) + "/readyz"
		if out, err := n.Exec(ctx, "curl", "-sSk", "--max-time", "2", direct); err == nil {
			t.Errorf("%s reached kube-apiserver directly at %s: %s", name, direct, out)
		}
		pods, err := i.client.CoreV1().Pods("atoll-system").List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/name=atoll-edge", FieldSelector: "spec.nodeName=" + name})
		if err != nil || len(pods.Items) > 0 {
			t.Errorf("atoll-edge pods on %s, whose agent is a host service: %v %d", name, err, len(pods.Items))
		}
	}
	m := i.cloudMetrics()
	line := grepLines(m, `atoll_tunnel_server_apiserver_connections_total{result="ok"}`)
	if n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(line, `atoll_tunnel_server_apiserver_connections_total{result="ok"}`))); n < len(names) {
		t.Errorf("atoll-cloud relayed %q connections of unit %s's %d nodes to kube-apiserver", line, unit, len(names))
	}
	slices.Sort(names)
	t.Logf("unit %s (%v): no direct way to kube-apiserver, atoll-edge as a host service, %s", unit, names, line)
}

// writesSince lists the writes (create, update, patch, delete) that the
// nodes of members and atoll-cloud made from since on, from the audit
// log: by user and object (subresource included), counted.
func (i *installation) writesSince(members []*kubenode.Node, since time.Time) map[string]int {
	i.t.Helper()
	events, err := kubetest.ReadAudit(i.bed.AuditLog())
	if err != nil {
		i.t.Fatal(err)
	}
	users := map[string]string{"system:serviceaccount:atoll-system:atoll-cloud": "atoll-cloud"}
	for _, m := range members {
		users["system:node:"+m.Name] = m.Name
	}
	out := map[string]int{}
	for _, e := range events {
		who, ok := users[e.User.Username]
		if !ok || e.Received.Before(since) || !slices.Contains([]string{"create", "update", "patch", "delete"}, e.Verb) {
			continue
		}
		obj := e.Object()
		if e.ObjectRef.Subresource != "" {
			obj += "/" + e.ObjectRef.Subresource
		}
		out[fmt.Sprintf("%s %s %s", who, e.Verb, obj)]++
	}
	return out
}
