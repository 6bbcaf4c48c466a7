package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/podbed"
)

// realNodesNet is the bridge of the demo's real nodes (kn9, 10.199.9.0/24).
const realNodesNet = 9

// runRealNodes is the demo on real nodes (test/podbed): Atoll installed as
// pods from its images and manifests on real kubelets and containerd, the
// grid's pods real containers; the first node's link to the cloud is cut
// silently (dropped packets) and restored. It prints the nodes as
// Kubernetes sees them, `atoll status` and the grid's pods.
func runRealNodes(ctx context.Context, o options, out io.Writer, log *slog.Logger, say func(string, ...any)) error {
	if err := kubenode.Prerequisites(); err != nil {
		return fmt.Errorf("--real-nodes: %w (run it as root after `go tool task node:build dns:build os:deps`)", err)
	}
	units := map[string][]string{}
	var first string
	for u := range o.units {
		unit := fmt.Sprintf("site-%c", 'a'+u)
		for n := range o.nodes {
			name := fmt.Sprintf("%s-%d", unit, n+1)
			units[unit] = append(units[unit], name)
			if first == "" {
				first = name
			}
		}
	}
	say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and %d real nodes (kubelet, containerd, kube-proxy);", o.units*o.nodes+1)
	say("building Atoll's images and installing it as a user does (kubectl apply --server-side -k) ...")
	start := time.Now()
	bed, err := podbed.Start(ctx, podbed.Options{Net: realNodesNet, Dir: o.dir, Units: units, Logger: log})
	if bed != nil {
		defer func() {
			say("atoll-demo: stopping the nodes and Kubernetes ...")
			if err := bed.Stop(); err != nil {
				log.Error("real nodes: stop", "err", err)
			}
		}()
	}
	if err != nil {
		if bed != nil {
			log.Error("real nodes: start failed", "err", err, "diagnostics", bed.Diagnostics())
		}
		return err
	}
	say("ready in %v: atoll-cloud and every atoll-edge Ready, every node enrolled by itself, atoll status SAFE", time.Since(start).Round(100*time.Millisecond))
	ctx, cancel := o.untilDone(ctx)
	defer cancel()
	say("  kubeconfig:     %s   (kubectl --kubeconfig … get pods -A -o wide)", bed.Cluster.KubeconfigPath())
	say("  your overlay:   %s", bed.Overlay)
	if url, err := portForward(ctx, bed, o); err != nil {
		say("  status page:    unavailable (%v)", err)
	} else {
		say("  status page:    %s", url)
	}
	login := strings.Join(bed.AtollEnv, " ")
	say("  atoll status:   %s go run ./services/atoll status", login)

	grids, err := newGridClient(bed.Cluster.RESTConfig())
	if err != nil {
		return err
	}
	if err := createGrid(ctx, grids, bed.Fleet.Image("hello")); err != nil {
		return err
	}
	say("grid %s/hello: a DeploymentGrid (one copy per site, two replicas in site-b) of real containers, and a ServiceGrid (hello-svc)", gridNamespace)

	cut := &realCut{o: o, bed: bed, say: say, node: first, start: time.Now()}
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		cut.step()
		printRealStatus(ctx, out, bed)
		printGrids(ctx, out, grids)
		select {
		case <-ctx.Done():
			cut.heal()
			return nil
		case <-t.C:
		}
	}
}

// portForward forwards a loopback port to atoll-cloud's admin port (the
// status page answers port-forwards, which arrive from loopback) and
// returns the page's URL.
func portForward(ctx context.Context, bed *podbed.Bed, o options) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	cmd := exec.CommandContext(ctx, bed.KubectlPath, "--kubeconfig", bed.Cluster.KubeconfigPath(),
		"-n", "atoll-system", "port-forward", "pod/atoll-cloud-0", fmt.Sprintf("%d:8080", port))
	logFile, err := os.OpenFile(o.dir+"/port-forward.log", os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return "", err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return "", err
	}
	go func() { _ = cmd.Wait(); logFile.Close() }()
	return fmt.Sprintf("http://127.0.0.1:%d/ui/", port), nil
}

// realCut cuts one node's link to the cloud silently (its packets to the
// apiserver's host and to the cloud node are dropped; its site peers
// still reach it) and restores it, as the simulated demo does.
type realCut struct {
	o     options
	bed   *podbed.Bed
	say   func(string, ...any)
	node  string
	start time.Time
	state int // 0 waiting, 1 cut, 2 restored
}

func (c *realCut) step() {
	if c.o.cutAfter <= 0 {
		return
	}
	n := c.bed.Edges[c.node]
	elapsed := time.Since(c.start)
	switch {
	case c.state == 0 && elapsed >= c.o.cutAfter:
		c.state = 1
		if err := n.Cut(kubenode.HostIP(realNodesNet), c.bed.Cloud.IP, c.bed.Cloud.PodCIDR); err != nil {
			c.say("\n>>> cut %s: %v", c.node, err)
			return
		}
		c.say("\n>>> cut %s from the cloud (its packets to the apiserver and the hub dropped); its site peers still reach it", c.node)
	case c.state == 1 && elapsed >= c.o.cutAfter+c.o.cutFor:
		c.heal()
		c.say("\n>>> restored %s's cloud link", c.node)
	}
}

func (c *realCut) heal() {
	if c.state == 1 {
		c.state = 2
		_ = c.bed.Edges[c.node].Heal()
	}
}

// printRealStatus prints each edge node as Kubernetes sees it (Ready,
// taints) with its pods' count, then `atoll status`.
func printRealStatus(ctx context.Context, out io.Writer, bed *podbed.Bed) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := bed.Cluster.Client()
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\n%s\nUNIT\tNODE\tK8S READY\tTAINTS\tPODS RUNNING\n", time.Now().Format("15:04:05"))
	nodes, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	if err != nil {
		fmt.Fprintf(out, "nodes: %v\n", err)
		return
	}
	pods, _ := client.CoreV1().Pods("").List(lctx, metav1.ListOptions{})
	running := map[string]int{}
	if pods != nil {
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running[p.Spec.NodeName]++
			}
		}
	}
	for _, n := range nodes.Items {
		unit := bed.Unit[n.Name]
		if unit == "" {
			continue
		}
		ready := "?"
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				ready = string(c.Status)
			}
		}
		var ts []string
		for _, t := range n.Spec.Taints {
			ts = append(ts, strings.TrimPrefix(t.Key, "node.kubernetes.io/")+":"+string(t.Effect))
		}
		taints := strings.Join(ts, ",")
		if taints == "" {
			taints = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\n", unit, n.Name, ready, taints, running[n.Name])
	}
	_ = w.Flush()
	status, _ := bed.Atoll(lctx, "status")
	fmt.Fprintf(out, "\n%s", status)
}
