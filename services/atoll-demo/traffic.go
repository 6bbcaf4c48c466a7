package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/test/testbed"
)

// proxyPort is where every simulated agent's endpoints proxy listens, on
// the node's own loopback address (as kube-proxy would read it).
const proxyPort = "9471"

// withProxy turns on each agent's endpoints proxy (--proxy-addr).
func withProxy(c *edgeapp.Config) {
	c.Proxy.Addr, c.Proxy.Enabled = net.JoinHostPort(c.Reporter.InternalIP, proxyPort), true
}

// servedEndpoints asks the endpoints proxy at ip which endpoints of the
// Service namespace/name it serves (what kube-proxy on that node would
// route to): "ip@node", sorted, ready ones only.
func servedEndpoints(ctx context.Context, hc *http.Client, ip, namespace, name string) ([]string, error) {
	u := fmt.Sprintf("http://%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector=%s",
		net.JoinHostPort(ip, proxyPort), namespace, url.QueryEscape(discoveryv1.LabelServiceName+"="+name))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", u, resp.Status)
	}
	var list discoveryv1.EndpointSliceList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	var out []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			node := "?"
			if e.NodeName != nil {
				node = *e.NodeName
			}
			for _, a := range e.Addresses {
				out = append(out, a+"@"+node)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// printTraffic prints, per node, the endpoints of the grid's Service that
// its endpoints proxy serves: the site-local traffic view (the topology
// filter at the edge keeps only the node's own site's endpoints).
func printTraffic(ctx context.Context, out io.Writer, bed *testbed.Bed) {
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	total := "?"
	if list, err := bed.Cluster.Client().DiscoveryV1().EndpointSlices(gridNamespace).List(lctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=hello-svc"}); err == nil {
		n := 0
		for _, s := range list.Items {
			for _, e := range s.Endpoints {
				if e.Conditions.Ready == nil || *e.Conditions.Ready {
					n += len(e.Addresses)
				}
			}
		}
		total = fmt.Sprint(n)
	}
	fmt.Fprintf(w, "ENDPOINTS OF %s/hello-svc SERVED BY EACH NODE'S PROXY (what its kube-proxy routes to; %s ready in the cluster)\nPROXY NODE\tSITE\tCOUNT\tENDPOINTS (ip@node)\n", gridNamespace, total)
	for _, n := range bed.Sites.Nodes() {
		if !n.Running() {
			fmt.Fprintf(w, "%s\t%s\t-\tagent stopped\n", n.Name, n.Unit)
			continue
		}
		eps, err := servedEndpoints(lctx, hc, n.IP, gridNamespace, "hello-svc")
		if err != nil {
			fmt.Fprintf(w, "%s\t%s\t-\tproxy: %v\n", n.Name, n.Unit, err)
			continue
		}
		list := strings.Join(eps, ",")
		if list == "" {
			list = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", n.Name, n.Unit, len(eps), list)
	}
	_ = w.Flush()
}
