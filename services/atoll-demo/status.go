package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/sitesim"
)

// printStatus prints one row per simulated node: the cloud's view (the
// Node's Ready condition and taints) next to the edge's (hub link, routes
// to unit peers, members known).
func printStatus(ctx context.Context, out io.Writer, client kubernetes.Interface, sites *sitesim.Sim) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ready := map[string]string{}
	taints := map[string]string{}
	if list, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{}); err == nil {
		for _, n := range list.Items {
			ready[n.Name] = "?"
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady {
					ready[n.Name] = string(c.Status)
				}
			}
			var ts []string
			for _, t := range n.Spec.Taints {
				ts = append(ts, strings.TrimPrefix(t.Key, "node.kubernetes.io/")+":"+string(t.Effect))
			}
			taints[n.Name] = strings.Join(ts, ",")
		}
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\n%s\nUNIT\tNODE\tIP\tK8S READY\tTAINTS\tAGENT\tHUB LINK\tROUTES\tMEMBERS\n", time.Now().Format("15:04:05"))
	for _, n := range sites.Nodes() {
		agent, hubLink, routes, members := "stopped", "-", "-", "-"
		if nn := n.NATS(); nn != nil {
			agent = "running"
			st := nn.Status()
			hubLink = "down"
			if st.HubConnected {
				hubLink = "up"
			}
			routes = fmt.Sprint(len(st.RoutedPeers))
			members = fmt.Sprint(len(n.Membership().Current().Members))
		}
		t := taints[n.Name]
		if t == "" {
			t = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Unit, n.Name, n.IP, ready[n.Name], t, agent, hubLink, routes, members)
	}
	_ = w.Flush()
}
