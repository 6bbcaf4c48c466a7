package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/leafemu"
)

// leafAgent is an emulated agent on a leaf link of its own
// (--scale-leafs): the node's credentials, TLS, the leafnode protocol
// (test/leafemu), its programs' nats.Conn over it.
type leafAgent struct {
	link *leafemu.Link
	nc   *nats.Conn
	js   jetstream.JetStream
}

// HubLink implements viewfeed.Node: a new connection of the link (after
// the hub cut it, or restarted) is a new ID, and the feeds catch up.
func (a *leafAgent) HubLink() natsnode.HubLink { return natsnode.HubLink{ID: a.link.Gen()} }

func (a *leafAgent) close() {
	a.nc.Close()
	_ = a.link.Close()
}

// leafAgentTTL is the emulated nodes' credentials' lifetime: longer than
// any run.
const leafAgentTTL = 24 * time.Hour

// dialLeafAgent issues node's edge credentials in unit and links it to
// the hub's leaf listener at url over TLS.
func dialLeafAgent(ctx context.Context, issuer *identity.Issuer, url string, cfg *tls.Config, node, unit string) (*leafAgent, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	userJWT, err := issuer.Edge(node, unit, pub, leafAgentTTL)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// Paced and as patient as atoll-edge's server's leaf remote.
	link, err := leafemu.Dial(dctx, leafemu.Options{URL: url, TLS: cfg, Name: node, JWT: userJWT, Seed: seed,
		Reconnect: natsnode.HubReconnectInterval, InfoTimeout: natsnode.HubInfoTimeout, TLSTimeout: natsnode.HubTLSTimeout})
	if err != nil {
		return nil, err
	}
	nc, err := link.Connect(nats.CustomInboxPrefix(events.InboxPrefix(node)))
	if err != nil {
		_ = link.Close()
		return nil, err
	}
	js, err := jetstream.NewWithDomain(nc, hub.Default().Domain)
	if err != nil {
		nc.Close()
		_ = link.Close()
		return nil, err
	}
	return &leafAgent{link: link, nc: nc, js: js}, nil
}

// leafTLS is the client side of the hub's leaf TLS: the CA in caFile,
// the certificate's name 127.0.0.1.
func leafTLS(caFile string) (*tls.Config, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}, nil
}

// leafJoinBatch is how many emulated agents link at once; each batch
// waits until the one before has caught up with its views.
const leafJoinBatch = 250

// leafJoinTries is how many times an agent dials the hub to join before
// the run fails; joinRetries counts the dials after a first refused one.
const leafJoinTries = 5

var joinRetries atomic.Int64

// joinLeafAgents links one emulated agent per node, leafJoinBatch at a
// time, each following its own four view spaces (emulateFeeds) and
// taking the shared space's changes in its unit's relay queue group, as a
// relaying agent does (the hub gives each change to one agent per unit;
// what that agent relays on its unit's routes never crosses the hub). On
// error the agents linked so far are returned with it.
func joinLeafAgents(ctx context.Context, o scaleOptions, issuer *identity.Issuer, url string, cfg *tls.Config,
	names, units []string, feeds *viewfeed.Metrics,
) ([]*leafAgent, error) {
	agents := make([]*leafAgent, 0, len(names))
	shared, err := events.Republished(events.SharedSpaceSubjects())
	if err != nil {
		return nil, err
	}
	for start := 0; start < len(names); start += leafJoinBatch {
		end := min(start+leafJoinBatch, len(names))
		batch := make([]*leafAgent, end-start)
		errs := make([]error, end-start)
		var wg sync.WaitGroup
		for i := start; i < end; i++ {
			wg.Go(func() {
				// A node's server dials again after a refusal (a loaded
				// hub's authentication timeout): a few times here, counted.
				a, err := dialLeafAgent(ctx, issuer, url, cfg, names[i], units[i])
				for try := 1; err != nil && try < leafJoinTries && ctx.Err() == nil; try++ {
					joinRetries.Add(1)
					time.Sleep(natsnode.HubReconnectInterval)
					a, err = dialLeafAgent(ctx, issuer, url, cfg, names[i], units[i])
				}
				if err == nil {
					_, err = a.nc.QueueSubscribe(shared, events.ViewRelayQueue(units[i]), func(*nats.Msg) {})
				}
				if err != nil {
					errs[i-start] = fmt.Errorf("agent %s: %w", names[i], err)
					return
				}
				batch[i-start] = a
				if feeds != nil {
					emulateFeeds(ctx, hublink.Of(a.nc, a.js), a, names[i], units[i], feeds)
				}
			})
		}
		wg.Wait()
		for i, a := range batch {
			if a != nil {
				agents = append(agents, a)
			} else if errs[i] != nil {
				return agents, errs[i]
			}
		}
		if err := ctx.Err(); err != nil {
			return agents, err
		}
		o.progress.count(end, len(names), "linked and caught up")
	}
	return agents, nil
}

// leafMsgs is what the agents' links sent the hub (out) and got from it
// (in).
func leafMsgs(agents []*leafAgent) (out, in int64) {
	for _, a := range agents {
		out += a.link.Out.Load()
		in += a.link.In.Load()
	}
	return out, in
}

// leafsDown is how many agents' links are down (cut by the hub, not
// linked again yet, or closed).
func leafsDown(agents []*leafAgent) (n int) {
	for _, a := range agents {
		if a.link.Gen() == 0 {
			n++
		}
	}
	return n
}

// leafReconnects is how many times the agents' links were linked again
// after the hub cut them.
func leafReconnects(agents []*leafAgent) (n int64) {
	for _, a := range agents {
		n += a.link.Reconnects.Load()
	}
	return n
}
