package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// HubServer is what one hub server's monitoring (/varz, /jsz) said.
type HubServer struct {
	// Pod is the server's pod, UID its identity: a pod made again
	// starts a new history.
	Pod string `json:"pod"`
	UID string `json:"uid"`
	// Name is the server's name.
	Name string `json:"name"`
	// Streams are its replicas' states by stream.
	Streams map[string]HubStream `json:"streams"`
	// Consumers are the durable consumers it leads.
	Consumers []HubConsumer `json:"consumers,omitempty"`
}

// HubStream is one stream's state on one server.
type HubStream struct {
	Msgs    uint64 `json:"msgs"`
	LastSeq uint64 `json:"lastSeq"`
	// Lost are the messages the server found lost from its store.
	Lost int `json:"lost,omitempty"`
}

// HubConsumer is one durable consumer as its leader sees it.
type HubConsumer struct {
	Stream string `json:"stream"`
	Name   string `json:"name"`
	// Pending are the messages not delivered yet, AckPending those
	// delivered and not acknowledged.
	Pending    uint64 `json:"pending"`
	AckPending int    `json:"ackPending"`
	// AckFloor is the stream sequence every message up to which is
	// acknowledged.
	AckFloor uint64 `json:"ackFloor"`
}

// hubServers reads the monitoring of every running pod of selector in
// namespace on port (each pod's hub server) and says how many pods run;
// a server that does not answer within 3 s is left out.
func hubServers(ctx context.Context, client kubernetes.Interface, namespace, selector, port string) (servers []HubServer, running int) {
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, 0
	}
	httpc := &http.Client{Timeout: 3 * time.Second}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			continue
		}
		running++
		base := "http://" + net.JoinHostPort(p.Status.PodIP, port)
		wg.Go(func() {
			s, err := hubServer(ctx, httpc, base)
			if err != nil {
				return
			}
			s.Pod, s.UID = p.Name, string(p.UID)
			mu.Lock()
			servers = append(servers, s)
			mu.Unlock()
		})
	}
	wg.Wait()
	return servers, running
}

func hubServer(ctx context.Context, httpc *http.Client, base string) (HubServer, error) {
	var varz server.Varz
	if err := getJSON(ctx, httpc, base+"/varz", &varz); err != nil {
		return HubServer{}, err
	}
	var jsz server.JSInfo
	if err := getJSON(ctx, httpc, base+"/jsz?accounts=true&streams=true&consumers=true&config=true", &jsz); err != nil {
		return HubServer{}, err
	}
	s := HubServer{Name: varz.Name, Streams: map[string]HubStream{}}
	for _, acc := range jsz.AccountDetails {
		for _, st := range acc.Streams {
			hs := HubStream{Msgs: st.State.Msgs, LastSeq: st.State.LastSeq}
			if st.State.Lost != nil {
				hs.Lost = len(st.State.Lost.Msgs)
			}
			s.Streams[st.Name] = hs
			for _, ci := range st.Consumer {
				if ci == nil || ci.Config == nil || ci.Config.Durable == "" {
					continue // an agent's short-lived catch-up, an ordered consumer
				}
				if ci.Cluster != nil && ci.Cluster.Leader != "" && ci.Cluster.Leader != varz.Name {
					continue // its leader reports it
				}
				s.Consumers = append(s.Consumers, HubConsumer{Stream: st.Name, Name: ci.Name,
					Pending: ci.NumPending, AckPending: ci.NumAckPending, AckFloor: ci.AckFloor.Stream})
			}
		}
	}
	return s, nil
}

func getJSON(ctx context.Context, httpc *http.Client, url string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := httpc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}

// AckedStream is the stream whose acknowledged messages must never be
// lost: the ballots and probe results (events.StreamHealth). The views'
// stream may be rebuilt by design.
const AckedStream = "HEALTH"

// ConsumerLagBound is how many messages a durable consumer may have
// pending (undelivered or unacknowledged) in a quiet period.
const ConsumerLagBound = 100

// hubState is what the checker remembers of the hub between samples.
type hubState struct {
	// last is, by stream, the highest last sequence any server held;
	// short since when every running server has held less.
	last    map[string]uint64
	short   map[string]time.Time
	pods    map[string]bool        // UIDs of the pods seen
	backlog map[string]HubConsumer // stream/consumer → its state at the last quiet sample with a backlog
	// WorstBacklog is the largest backlog of a durable consumer seen in
	// a quiet period.
	worstBacklog uint64
}

// checkHub judges a sample of the hub's servers at now, of which running
// pods run: no acknowledged message of AckedStream lost, and, in quiet
// periods, every durable consumer caught up (a backlog of at most
// ConsumerLagBound that moves). Call with c.mu held.
//
// A message is lost when no server holds it: every running server
// answered (one at least: a sample the apiserver could not list judges
// nothing) and the highest last sequence among them stayed below the
// highest seen for two samples in a row. One server going back is not
// a loss: a replica killed with SIGKILL restarts from what its store
// had flushed and catches up from its peers' log (each server's own
// sequence is in the samples). A hub whose every answering pod is new
// starts a history of its own (a hub without a volume, remade).
func (c *Checker) checkHub(now time.Time, servers []HubServer, running int) {
	h := &c.hub
	highest := map[string]uint64{}
	known := false
	for _, s := range servers {
		known = known || h.pods[s.UID]
		for name, st := range s.Streams {
			if st.Lost > 0 {
				c.violate(now, InvViews, "stream/"+name, "server %s found %d messages lost from its store", s.Name, st.Lost)
			}
			highest[name] = max(highest[name], st.LastSeq)
		}
	}
	for _, s := range servers {
		h.pods[s.UID] = true
	}
	if len(servers) > 0 && !known {
		clear(h.last)
		clear(h.short)
	}
	if last, held := h.last[AckedStream], highest[AckedStream]; len(servers) > 0 && len(servers) == running && held < last {
		if since, ok := h.short[AckedStream]; !ok {
			h.short[AckedStream] = now
		} else if now.Sub(since) >= SampleEvery {
			c.violate(now, InvViews, "stream/"+AckedStream, "no server holds messages past %d for %s, %d were stored: acknowledged messages lost", held, now.Sub(since).Round(time.Second), last)
		}
	} else {
		delete(h.short, AckedStream)
	}
	h.last[AckedStream] = max(h.last[AckedStream], highest[AckedStream])

	quiet := c.truth.quiet(now)
	seen := map[string]bool{}
	for _, s := range servers {
		for _, co := range s.Consumers {
			key := co.Stream + "/" + co.Name
			if seen[key] {
				continue
			}
			seen[key] = true
			backlog := co.Pending + uint64(co.AckPending)
			if !quiet || backlog == 0 {
				delete(h.backlog, key)
				continue
			}
			h.worstBacklog = max(h.worstBacklog, backlog)
			switch prev, ok := h.backlog[key]; {
			case backlog > ConsumerLagBound:
				c.violate(now, InvViews, "consumer/"+key, "%d messages pending while nothing happens (bound %d)", backlog, ConsumerLagBound)
			case ok && co.AckFloor == prev.AckFloor:
				c.violate(now, InvViews, "consumer/"+key, "%d messages pending and nothing acknowledged for %s while nothing happens", backlog, SampleEvery)
			}
			h.backlog[key] = co
		}
	}
}
