package hub_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
	"github.com/atoll-edge/atoll/test/promtest"
)

// fabric is one hub shape under test: the embedded single server or the
// three-server cluster in operator mode.
type fabric struct {
	hub        natstest.HubServers
	issuer     *identity.Issuer
	service    func(t *testing.T) *nats.Conn
	client     hublink.ClientConfig
	violations func() int64
	replicas   int
}

func shapes() map[string]func(t *testing.T) fabric {
	return map[string]func(t *testing.T) fabric{
		"embedded": func(t *testing.T) fabric {
			h := natstest.Hub(t)
			return fabric{hub: h, issuer: h.Issuer(), replicas: 1, client: h.ClientConfig(),
				service: func(t *testing.T) *nats.Conn {
					nc, err := h.Connect("cloud")
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(nc.Close)
					return nc
				},
				violations: h.Violations}
		},
		"cluster": func(t *testing.T) fabric {
			c := natstest.NewHubCluster(t)
			return fabric{hub: c, issuer: c.Issuer(), replicas: 3, client: c.ClientConfig(),
				service: func(t *testing.T) *nats.Conn {
					nc, err := c.Connect(c.Server(0), "cloud")
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(nc.Close)
					return nc
				},
				violations: func() int64 {
					var n int64
					for i := range natstest.ClusterSize {
						if h := c.Server(i); h != nil {
							n += h.Violations()
						}
					}
					return n
				}}
		},
	}
}

// collect subscribes nc to subject and returns what arrived so far.
func collect(t *testing.T, nc *nats.Conn, subject string) func() []string {
	t.Helper()
	ch := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var got []string
	return func() []string {
		for {
			select {
			case m := <-ch:
				got = append(got, m.Subject)
			default:
				return got
			}
		}
	}
}

// TestEdgePermissions: the hub servers enforce each node's permissions on
// its leaf connection. Node a (unit u1) publishing a ballot or a topology
// update as b reaches nothing on the hub, while its own do; its probe
// reports, even in its own name, stay at the edge; a
// hears its unit's views and its assignment, not another unit's views nor
// b's assignment; it relays tunnel sessions only in its own namespace and
// never sends or hears the unit legs of relays over its leaf; its consumers can only be created on its own subjects,
// and it can neither delete nor purge a stream. A leaf that ignores the
// permissions the hub told it (a tampered server) is refused, counted and
// cut off.
func TestEdgePermissions(t *testing.T) {
	for name, start := range shapes() {
		t.Run(name, func(t *testing.T) {
			f := start(t)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cloud := f.service(t)
			cjs, err := jetstream.NewWithDomain(cloud, "hub")
			if err != nil {
				t.Fatal(err)
			}
			poll.Eventually(t, 30*time.Second, func() error {
				return eventbus.EnsureStreams(ctx, cjs, events.StreamOptions{Replicas: f.replicas, Storage: jetstream.FileStorage})
			})
			u1 := natstest.Unit(t, f.hub, "u1", natstest.EdgeOptions{}, "a", "b")
			u2 := natstest.Unit(t, f.hub, "u2", natstest.EdgeOptions{}, "c")
			agent := func(i int, n interface {
				Connect(string, ...nats.Option) (*nats.Conn, error)
			}) *nats.Conn {
				nc, err := n.Connect(fmt.Sprint("agent-", i))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				return nc
			}
			a, c := agent(0, u1[0]), agent(2, u2[0])
			for _, n := range append(u1, u2...) {
				poll.Eventually(t, 20*time.Second, func() error {
					if !n.Status().HubConnected {
						return fmt.Errorf("%s not linked", n.Name())
					}
					return nil
				})
			}

			// Publishing: what a sends in its own name reaches the hub,
			// what it sends in b's name does not.
			atHub := collect(t, cloud, "atoll.>")
			own := []string{"atoll.health.ballot.u1.a", "atoll.topo.node.a", "atoll.tunnel.a.relay.b.s1.out", "atoll.tunnel.a.apiserver"}
			forged := []string{"atoll.health.probe.u1.b", "atoll.topo.node.b", "atoll.tunnel.b.apiserver",
				"atoll.health.probe.u2.a", "atoll.tunnel.b.s1.out", "atoll.view.u1.unit._.u1",
				// Relaying: only in its own namespace, and never the unit legs.
				"atoll.tunnel.b.relay.a.s1.out", "atoll.tunnel.a.relay.b.s1.in", "atoll.relay.u1.a.b.s1.out", "atoll.relay.u1.b.a.s1.in",
				"atoll.health.ballot.u1.b", "atoll.health.ballot.u2.a",
				// Its own, but they stay inside the unit.
				"atoll.health.probe.u1.a", "atoll.viewrelay.u1.services.default.web", "atoll.viewrelay.u1.a.reset"}
			poll.Eventually(t, 20*time.Second, func() error {
				for _, s := range append(forged, own...) {
					if err := a.Publish(s, []byte("x")); err != nil {
						return err
					}
				}
				if err := a.Flush(); err != nil {
					return err
				}
				got := atHub()
				for _, s := range own {
					if !contains(got, s) {
						return fmt.Errorf("%s did not reach the hub (got %v)", s, got)
					}
				}
				return nil
			})
			for _, s := range atHub() {
				if contains(forged, s) {
					t.Errorf("forged %s reached the hub", s)
				}
			}

			// Hearing: a hears its unit's views, its assignment and its
			// tunnel frames only.
			aHears := collect(t, a, "atoll.>")
			cHears := collect(t, c, "atoll.view.>")
			sent := []string{"atoll.view.u1.unit._.u1", "atoll.view._.assignment._.a", "atoll.view._.assignment._.b", "atoll.view.u2.unit._.u2", "atoll.view._.assignment._.c",
				"atoll.tunnel.a.s1.in", "atoll.tunnel.b.s1.in", "atoll.health.probe.u2.c", "atoll.topo.node.c",
				"atoll.tunnel.a.relay.b.s1.in", "atoll.tunnel.b.relay.a.s1.in", "atoll.tunnel.a.relay.b.s1.out", "atoll.relay.u1.b.a.s1.in",
				"atoll.health.probe.u1.b", "atoll.health.ballot.u1.b"}
			poll.Eventually(t, 20*time.Second, func() error {
				for _, s := range sent {
					if err := cloud.Publish(s, []byte("v")); err != nil {
						return err
					}
				}
				if err := cloud.Flush(); err != nil {
					return err
				}
				if got := aHears(); !contains(got, "atoll.view.u1.unit._.u1") || !contains(got, "atoll.view._.assignment._.a") || !contains(got, "atoll.tunnel.a.s1.in") || !contains(got, "atoll.tunnel.a.relay.b.s1.in") {
					return fmt.Errorf("a heard %v", got)
				}
				if got := cHears(); !contains(got, "atoll.view.u2.unit._.u2") || !contains(got, "atoll.view._.assignment._.c") {
					return fmt.Errorf("c heard %v", got)
				}
				return nil
			})
			// And the hub's republished copies of its own views (VIEWS'
			// RePublish, edge/viewfeed), not another node's or unit's.
			mine := []string{"atoll.view.u1.unit._.u1", "atoll.view._.assignment._.a", "atoll.tunnel.a.s1.in", "atoll.tunnel.a.relay.b.s1.in",
				"atoll.viewpub.u1.unit._.u1", "atoll.viewpub._.assignment._.a"}
			for _, s := range aHears() {
				if !contains(mine, s) {
					t.Errorf("a heard %s", s)
				}
			}

			// JetStream: a consumes its own view subjects, nothing else.
			ajs, err := jetstream.NewWithDomain(a, "hub")
			if err != nil {
				t.Fatal(err)
			}
			short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 3*time.Second) }
			poll.Eventually(t, 20*time.Second, func() error {
				cctx, cancel := short()
				defer cancel()
				_, err := ajs.OrderedConsumer(cctx, events.StreamViews, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"atoll.view._.assignment._.a"}})
				return err
			})
			for _, filter := range []string{"atoll.view._.assignment._.b", "atoll.view.u2.>", "atoll.view.>"} {
				cctx, cancel := short()
				_, err := ajs.OrderedConsumer(cctx, events.StreamViews, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
				cancel()
				if err == nil {
					t.Errorf("a created a consumer on %s", filter)
				}
			}
			// Direct gets (what the agent compares its views with): its
			// own assignment and unit view, nobody else's. The cloud's
			// publishes above stored a value on each subject.
			views, err := ajs.Stream(ctx, events.StreamViews)
			if err != nil {
				t.Fatalf("a reads VIEWS' info: %v", err)
			}
			if !views.CachedInfo().Config.AllowDirect {
				t.Fatal("VIEWS does not allow direct gets")
			}
			for _, subj := range []string{"atoll.view._.assignment._.a", "atoll.view.u1.unit._.u1"} {
				poll.Eventually(t, 20*time.Second, func() error {
					cctx, cancel := short()
					defer cancel()
					_, err := views.GetLastMsgForSubject(cctx, subj)
					return err
				})
			}
			for _, subj := range []string{"atoll.view._.assignment._.b", "atoll.view.u2.unit._.u2"} {
				cctx, cancel := short()
				if _, err := views.GetLastMsgForSubject(cctx, subj); err == nil {
					t.Errorf("a read the last value of %s", subj)
				}
				cancel()
			}
			cctx, cancel2 := short()
			if _, err := ajs.CreateOrUpdateConsumer(cctx, events.StreamHealth, jetstream.ConsumerConfig{Durable: "steal"}); err == nil {
				t.Error("a created an unfiltered consumer on HEALTH")
			}
			cancel2()
			for _, op := range []func(context.Context) error{
				func(ctx context.Context) error { return ajs.DeleteStream(ctx, events.StreamViews) },
				func(ctx context.Context) error {
					s, err := cjs.Stream(ctx, events.StreamViews)
					if err != nil {
						return err
					}
					// Purge through a's connection, on the stream cjs found.
					_, err = a.Request("$JS.hub.API.STREAM.PURGE."+s.CachedInfo().Config.Name, nil, 2*time.Second)
					return err
				},
			} {
				cctx, cancel := short()
				if err := op(cctx); err == nil {
					t.Error("a deleted or purged a stream")
				}
				cancel()
			}
			if _, err := cjs.Stream(ctx, events.StreamViews); err != nil {
				t.Errorf("VIEWS is gone: %v", err)
			}

			// A tampered leaf with a's credentials that publishes as b is
			// refused, counted and cut off; the identity service counts
			// and logs the cut-off under a's name.
			var logs bytes.Buffer
			var logsMu sync.Mutex
			log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				logsMu.Lock()
				defer logsMu.Unlock()
				return logs.Write(p)
			}), nil))
			reg := prometheus.NewRegistry()
			sys, err := identity.DialSystem(ctx, f.client, f.issuer, log)
			if err != nil {
				t.Fatal(err)
			}
			defer sys.Close()
			if _, err := identity.FollowViolations(sys, f.issuer.Keys().AccountKey(), log, identity.NewMetrics(reg)); err != nil {
				t.Fatal(err)
			}
			before := f.violations()
			kp, _ := nkeys.CreateUser()
			pub, _ := kp.PublicKey()
			userJWT, err := f.hub.IssueEdge("a", "u1", pub)
			if err != nil {
				t.Fatal(err)
			}
			u, _ := url.Parse(f.hub.LeafURLs()[0])
			if err := rogueLeaf(u.Host, userJWT, kp, "atoll.topo.node.b"); err != nil {
				t.Fatal(err)
			}
			poll.Eventually(t, 10*time.Second, func() error {
				if f.violations() <= before {
					return errors.New("no violation counted")
				}
				if n := promtest.Counter(t, reg, "atoll_identity_violations_total", map[string]string{"role": "edge", "node": "a"}); n != 1 {
					return fmt.Errorf("%v violations counted for node a, want 1", n)
				}
				logsMu.Lock()
				defer logsMu.Unlock()
				if !strings.Contains(logs.String(), "cut off a connection") || !strings.Contains(logs.String(), "node=a ") {
					return fmt.Errorf("the cut-off is not logged under a's name:\n%s", logs.String())
				}
				return nil
			})
			if got := atHub(); contains(got, "atoll.topo.node.b") {
				t.Error("the tampered leaf's atoll.topo.node.b reached the hub")
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// rogueLeaf speaks the leafnode protocol itself, as a server that ignores
// the permissions the hub sent it would: it logs in with userJWT and
// publishes on subject, then expects the hub to close the connection.
func rogueLeaf(addr, userJWT string, kp nkeys.KeyPair, subject string) error {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	var info struct {
		Nonce string `json:"nonce"`
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(strings.TrimSpace(line), "INFO ")), &info); err != nil {
		return fmt.Errorf("info %q: %w", line, err)
	}
	sig, _ := kp.Sign([]byte(info.Nonce))
	connect, _ := json.Marshal(map[string]any{"jwt": userJWT, "sig": base64.RawURLEncoding.EncodeToString(sig),
		"name": "rogue", "headers": true, "proto": 1})
	if _, err := fmt.Fprintf(conn, "CONNECT %s\r\nPING\r\n", connect); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("login: %w", err)
		}
		if strings.HasPrefix(line, "-ERR") {
			return fmt.Errorf("login: %s", line)
		}
		if strings.HasPrefix(line, "PONG") {
			break
		}
	}
	if _, err := fmt.Fprintf(conn, "LMSG %s 1\r\nx\r\n", subject); err != nil {
		return err
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return nil // closed by the hub
		}
		if strings.HasPrefix(line, "PING") {
			_, _ = fmt.Fprint(conn, "PONG\r\n")
		}
	}
}

// writerFunc is an io.Writer.
type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
