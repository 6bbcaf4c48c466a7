package leafemu_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/leafemu"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// tlsHub starts a hub whose leaf listener requires TLS and returns it
// with a client TLS config trusting it.
func tlsHub(t *testing.T) (*hub.Hub, *tls.Config) {
	t.Helper()
	files := natstest.NewTLS(t, t.TempDir(), "leafemu")
	h := natstest.Hub(t, func(c *natstest.HubConfig) {
		c.LeafTLS = natstest.HubTLS{CertFile: files.CertFile, KeyFile: files.KeyFile}
	})
	ca, err := os.ReadFile(files.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return h, &tls.Config{RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
}

// node issues node's credentials in unit and returns the link options.
func node(t *testing.T, h *hub.Hub, cfg *tls.Config, name, unit string) leafemu.Options {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	userJWT, err := h.IssueEdge(name, unit, pub)
	if err != nil {
		t.Fatal(err)
	}
	return leafemu.Options{URL: h.LeafURL().String(), TLS: cfg, Name: name, JWT: userJWT, Seed: seed}
}

// linkNode links node (unit u1) to h over TLS and connects a program of
// the node over the link, with the node's inbox prefix; both close with
// the test.
func linkNode(t *testing.T, h *hub.Hub, cfg *tls.Config, name string) (*leafemu.Link, *nats.Conn) {
	t.Helper()
	l, err := leafemu.Dial(t.Context(), node(t, h, cfg, name, "u1"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	nc, err := l.Connect(nats.CustomInboxPrefix(events.InboxPrefix(name)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return l, nc
}

// TestLinkThroughTheHub: an emulated node's leaf link authenticates with
// the node's own credentials over TLS; the hub names the link by the
// node; a program on the node publishes a ballot to the HEALTH stream
// through it and gets the stream's ack on its own inbox; the cloud's
// message on the node's inbox reaches it; a request nobody answers fails
// with no responders at once; a link with a seed that does
// not match its JWT, or without TLS, is refused with the hub's reason.
func TestLinkThroughTheHub(t *testing.T) {
	h, cfg := tlsHub(t)
	cloud, _ := natstest.CloudStreams(t, h)
	ctx := t.Context()

	l, nc := linkNode(t, h, cfg, "emu-1")

	// The hub sees a leaf named after the node.
	poll.Eventually(t, 10*time.Second, func() error {
		lz, err := h.Server().Leafz(nil)
		if err != nil {
			return err
		}
		for _, lf := range lz.Leafs {
			if lf.Name == "emu-1" {
				return nil
			}
		}
		return fmt.Errorf("no leaf emu-1 at the hub: %d leafs", len(lz.Leafs))
	})

	// Edge → hub, and the ack back on the node's inbox.
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	subj, err := events.BallotSubject("u1", "emu-1")
	if err != nil {
		t.Fatal(err)
	}
	b := &atollv1.Ballot{Voter: "emu-1", Unit: "u1", Time: timestamppb.Now(), Ttl: durationpb.New(time.Minute)}
	poll.Eventually(t, 10*time.Second, func() error {
		_, err := events.PublishDurable(ctx, js, subj, b, "")
		return err
	})

	// Hub → edge: a message on the node's inbox.
	got := make(chan *nats.Msg, 1)
	sub, err := nc.ChanSubscribe(events.InboxPrefix("emu-1")+".cloud", got)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if err := cloud.Publish(events.InboxPrefix("emu-1")+".cloud", []byte("hello")); err != nil {
			return err
		}
		select {
		case m := <-got:
			if string(m.Data) != "hello" {
				return fmt.Errorf("got %q", m.Data)
			}
			return nil
		case <-time.After(200 * time.Millisecond):
			return fmt.Errorf("the cloud's message did not reach the node")
		}
	})
	if l.In.Load() == 0 || l.Out.Load() == 0 {
		t.Fatalf("link counted %d in, %d out", l.In.Load(), l.Out.Load())
	}

	// A request nobody answers fails at once, as a server tells it.
	if _, err := nc.Request(events.InboxPrefix("emu-1")+".nobody", nil, 5*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("a request nobody answers: %v, want no responders", err)
	}

	// Refusals.
	bad := node(t, h, cfg, "emu-2", "u1")
	other, _ := nkeys.CreateUser()
	bad.Seed, _ = other.Seed()
	if _, err := leafemu.Dial(ctx, bad); err == nil || !strings.Contains(err.Error(), "Authorization") {
		t.Fatalf("a seed that does not match the JWT: %v", err)
	}
	plain := node(t, h, cfg, "emu-3", "u1")
	plain.TLS = nil
	if _, err := leafemu.Dial(ctx, plain); err == nil || !strings.Contains(err.Error(), "TLS") {
		t.Fatalf("a plaintext link to a TLS hub: %v", err)
	}
}

// TestLinkReconnects: a link with Reconnect set outlives its connection:
// cut (every connection closed, new ones refused for a while), it is
// down (Gen 0) and what its programs publish meanwhile is dropped, not
// queued; let through again, it links on a new connection (a new Gen),
// sends the node's interest again, so that a subscription its program
// made before the cut gets the cloud's message, and its program's
// publishes reach the hub again. Its program stays connected throughout.
func TestLinkReconnects(t *testing.T) {
	h, cfg := tlsHub(t)
	cloud, _ := natstest.CloudStreams(t, h)
	proxy := natstest.NewProxy(t, h.LeafURL().Host)
	o := node(t, h, cfg, "emu-r", "u1")
	o.URL = "nats-leaf://" + proxy.Addr()
	o.Reconnect = 100 * time.Millisecond
	l, err := leafemu.Dial(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	nc, err := l.Connect(nats.CustomInboxPrefix(events.InboxPrefix("emu-r")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if l.Gen() != 1 {
		t.Fatalf("first connection's Gen %d, want 1", l.Gen())
	}
	got := make(chan *nats.Msg, 16)
	if _, err := nc.ChanSubscribe(events.InboxPrefix("emu-r")+".cloud", got); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The cloud's message reaches the node; its reply reaches the cloud.
	heard := make(chan *nats.Msg, 16)
	if _, err := cloud.ChanSubscribe("atoll.topo.node.emu-r", heard); err != nil {
		t.Fatal(err)
	}
	roundTrip := func(want string) error {
		if err := cloud.Publish(events.InboxPrefix("emu-r")+".cloud", []byte(want)); err != nil {
			return err
		}
		select {
		case m := <-got:
			if string(m.Data) != want {
				return fmt.Errorf("the node got %q, want %q", m.Data, want)
			}
		case <-time.After(200 * time.Millisecond):
			return fmt.Errorf("the cloud's %q did not reach the node (Gen %d)", want, l.Gen())
		}
		if err := nc.Publish("atoll.topo.node.emu-r", []byte(want)); err != nil {
			return err
		}
		select {
		case m := <-heard:
			if string(m.Data) != want {
				return fmt.Errorf("the cloud heard %q, want %q", m.Data, want)
			}
			return nil
		case <-time.After(200 * time.Millisecond):
			return fmt.Errorf("the node's %q did not reach the cloud (Gen %d)", want, l.Gen())
		}
	}
	poll.Eventually(t, 10*time.Second, func() error { return roundTrip("before") })

	proxy.Cut()
	poll.Eventually(t, 10*time.Second, func() error {
		if g := l.Gen(); g != 0 {
			return fmt.Errorf("Gen %d after the cut, want 0 (down)", g)
		}
		return nil
	})
	// Down: the program's publish is dropped (no interest of the hub's),
	// and the program is still connected.
	if err := nc.Publish("atoll.topo.node.emu-r", []byte("while down")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatalf("the node's program lost its connection with the link: %v", err)
	}
	time.Sleep(300 * time.Millisecond) // several reconnect attempts, refused
	proxy.Restore()
	poll.Eventually(t, 10*time.Second, func() error { return roundTrip("after") })
	if g := l.Gen(); g < 2 {
		t.Fatalf("Gen %d after the reconnect, want ≥ 2", g)
	}
	if l.Reconnects.Load() < 1 {
		t.Fatalf("%d reconnects counted", l.Reconnects.Load())
	}
	select {
	case m := <-heard:
		t.Fatalf("the cloud heard %q: a publish while the link was down was queued", m.Data)
	default:
	}
	select {
	case <-l.Done():
		t.Fatalf("the link closed: %v", l.Err())
	default:
	}
	if !nc.IsConnected() {
		t.Fatal("the node's program was disconnected")
	}
}

// TestHubSilent: a hub that accepts the connection and says nothing (no
// INFO), or says INFO and then nothing (no TLS handshake), fails the
// dial after the link's InfoTimeout or TLSTimeout, as a node's leaf
// remote does, well before the dial's own deadline.
func TestHubSilent(t *testing.T) {
	_, cfg := tlsHub(t)
	for _, c := range []struct {
		name, info, want string
	}{
		{"no INFO", "", "read INFO"},
		{"no TLS handshake", `INFO {"tls_required":true,"nonce":"n"}` + "\r\n", "TLS"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				for {
					conn, err := ln.Accept()
					if err != nil {
						return
					}
					_, _ = conn.Write([]byte(c.info))
					defer conn.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			_, err = leafemu.Dial(ctx, leafemu.Options{URL: "tls://" + ln.Addr().String(), TLS: cfg, Name: "n1",
				InfoTimeout: 200 * time.Millisecond, TLSTimeout: 200 * time.Millisecond})
			if err == nil || !strings.Contains(err.Error(), c.want) || ctx.Err() != nil {
				t.Fatalf("dial a hub that says %q and then nothing: %v (want a %s timeout, before the dial's deadline)", c.info, err, c.want)
			}
			t.Log(err)
		})
	}
}
