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

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/test/testbed"
)

// printStatus prints one row per simulated node: the cloud's view (the
// Node's Ready condition and taints), Atoll's (the peers' verdict, the
// unit's state, whether Atoll protects the node, whether its pods'
// endpoints are ready) and the edge's (hub link, routes, members known).
func printStatus(ctx context.Context, out io.Writer, bed *testbed.Bed) {
	client, sites := bed.Cluster.Client(), bed.Sites
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
	fmt.Fprintf(w, "\n%s\nUNIT\tNODE\tK8S READY\tTAINTS\tPEER VERDICT\tUNIT STATE\tPROTECTED\tENDPOINT\tAGENT\tHUB LINK\tROUTES\tMEMBERS\n", time.Now().Format("15:04:05"))
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
		j := bed.Health.Tally(n.Name)
		verdict := fmt.Sprintf("%s %d/%d/%d", health.VerdictName(j.Verdict), j.Healthy, j.Unhealthy, j.Undecided)
		state, _ := bed.Health.UnitState(n.Unit)
		protected := "-"
		if bed.Health.Protected(n.Name) {
			protected = "yes"
		}
		endpoint := "not ready"
		if ok, err := bed.EndpointReady(lctx, n.Unit, testbed.WebPod(n.Name)); err == nil && ok {
			endpoint = "ready"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Unit, n.Name, ready[n.Name], t, verdict, state, protected, endpoint, agent, hubLink, routes, members)
	}
	_ = w.Flush()
}
