package tunnelproto_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

type env struct {
	proxy      *natstest.Proxy
	cloud, edg *nats.Conn
	dialer     *tunnelproto.Dialer
	ln         *tunnelproto.Listener
	wg         sync.WaitGroup
	cancel     context.CancelFunc
}

// start runs a hub, node n1's edge server behind a cuttable leaf link (with
// the node's own credentials, so the hub enforces its permissions), a
// Dialer on the hub and a Listener on the edge whose agent echoes every
// session and refuses target "refuse".
func start(t *testing.T, cfg tunnelproto.Config) *env {
	t.Helper()
	h := natstest.Hub(t)
	e := &env{proxy: natstest.NewProxy(t, h.LeafURL().Host)}
	n := natstest.Edge(t, h, "n1", natstest.EdgeOptions{HubURL: "nats-leaf://" + e.proxy.Addr()})
	var err error
	if e.cloud, err = h.Connect("tunnel-server"); err != nil {
		t.Fatal(err)
	}
	if e.edg, err = n.Connect("tunnel-agent"); err != nil {
		t.Fatal(err)
	}
	if e.dialer, err = tunnelproto.NewDialer(e.cloud, cfg); err != nil {
		t.Fatal(err)
	}
	if e.ln, err = tunnelproto.Listen(e.edg, "n1", cfg, 1024); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			r, err := e.ln.Accept(ctx)
			if err != nil {
				return
			}
			if r.Target == "refuse" {
				r.Refuse("target refuse not allowed")
				continue
			}
			c := r.Accept()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.CloseWrite()
				}
			}()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = e.ln.Close()
		e.wg.Wait()
		e.cloud.Close()
		e.edg.Close()
	})
	return e
}

func (e *env) dial(t *testing.T, target string) *tunnelproto.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, err := e.dialer.Dial(ctx, "n1", target)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	return c
}

// echo sends n random bytes through c and checks the echo byte for byte,
// calling mid once half the bytes were sent.
func echo(t *testing.T, c *tunnelproto.Conn, n int, mid func()) {
	t.Helper()
	want := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range want {
		want[i] = byte(r.Uint32())
	}
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < n; off += 64 << 10 {
			if mid != nil && off >= n/2 && off-64<<10 < n/2 {
				mid()
			}
			if _, err := c.Write(want[off:min(n, off+64<<10)]); err != nil {
				errc <- err
				return
			}
		}
		errc <- c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("echo differs: %d bytes, sha %x, want %d sha %x", len(got), sha256.Sum256(got), n, sha256.Sum256(want))
	}
}

// settled runs one short session to its end, so that what the servers
// and clients start on first use (not per session) runs already, and
// returns the goroutine and cloud subscription counts noLeaks compares
// with.
func settled(t *testing.T, e *env) (goroutines, cloudSubs int) {
	t.Helper()
	cloudSubs = e.cloud.NumSubscriptions()
	c := e.dial(t, "127.0.0.1:10250")
	echo(t, c, 1<<10, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Its end lingers (TestDialerLingers): wait until it is gone.
	poll.Eventually(t, 30*time.Second, func() error {
		if s := e.ln.Sessions(); s != 0 {
			return fmt.Errorf("%d agent sessions", s)
		}
		if n := e.cloud.NumSubscriptions(); n != cloudSubs {
			return fmt.Errorf("%d cloud subscriptions, want %d", n, cloudSubs)
		}
		return nil
	})
	time.Sleep(200 * time.Millisecond)
	return runtime.NumGoroutine(), cloudSubs
}

// noLeaks waits for the goroutines and subscriptions to return to their
// counts from before.
func noLeaks(t *testing.T, e *env, goroutines, cloudSubs int) {
	t.Helper()
	poll.Eventually(t, 15*time.Second, func() error {
		if s := e.ln.Sessions(); s != 0 {
			return fmt.Errorf("%d agent sessions", s)
		}
		if n := e.cloud.NumSubscriptions(); n != cloudSubs {
			return fmt.Errorf("%d cloud subscriptions, want %d", n, cloudSubs)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			return fmt.Errorf("%d goroutines, want %d", n, goroutines)
		}
		return nil
	})
}

func TestEchoThroughHub(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	g, subs := settled(t, e)
	c := e.dial(t, "127.0.0.1:10250")
	echo(t, c, 16<<20, nil)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	noLeaks(t, e, g, subs)
}

func TestConcurrentSessions(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	g, subs := settled(t, e)
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := e.dial(t, "127.0.0.1:10250")
			defer c.Close()
			echo(t, c, 10_000+i, nil)
		}()
	}
	wg.Wait()
	noLeaks(t, e, g, subs)
}

// TestLeafCutMidTransfer: the node's leaf link is down for 5 s in the
// middle of a transfer; the transfer completes intact, by resends.
func TestLeafCutMidTransfer(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	c := e.dial(t, "127.0.0.1:10250")
	defer c.Close()
	echo(t, c, 32<<20, func() {
		e.proxy.Cut()
		time.AfterFunc(5*time.Second, e.proxy.Restore)
	})
	if c.Stats().FramesResent == 0 {
		t.Error("no frame was resent across the cut")
	}
}

// TestLeafCutBeyondLinkTimeout: a cut longer than LinkTimeout fails the
// session on both ends, and nothing leaks.
func TestLeafCutBeyondLinkTimeout(t *testing.T) {
	e := start(t, tunnelproto.Config{KeepAlive: 200 * time.Millisecond, LinkTimeout: time.Second})
	g, subs := settled(t, e)
	c := e.dial(t, "127.0.0.1:10250")
	e.proxy.Cut()
	defer e.proxy.Restore()
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, tunnelproto.ErrPeerLost) {
		t.Fatalf("read after the cut: %v, want peer lost", err)
	}
	_ = c.Close()
	noLeaks(t, e, g, subs)
}

func TestRefusedTarget(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	_, err := e.dialer.Dial(context.Background(), "n1", "refuse")
	var pe *tunnelproto.PeerError
	if !errors.As(err, &pe) || pe.Reason != "target refuse not allowed" {
		t.Fatalf("dial: %v, want the agent's refusal", err)
	}
}

// TestNoAgent: a dial to a node without an agent fails after LinkTimeout.
func TestNoAgent(t *testing.T) {
	e := start(t, tunnelproto.Config{KeepAlive: 100 * time.Millisecond, LinkTimeout: 500 * time.Millisecond})
	_, err := e.dialer.Dial(context.Background(), "n2", "127.0.0.1:10250")
	if !errors.Is(err, tunnelproto.ErrPeerLost) {
		t.Fatalf("dial: %v, want peer lost", err)
	}
}

// TestHalfCloseBothWays: each side's CloseWrite reaches the other as EOF
// while the other direction keeps flowing; Close from either side ends
// the session on both.
func TestHalfCloseBothWays(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	g, subs := settled(t, e)
	// Cloud half-closes first: the echo agent still sends everything back.
	c := e.dial(t, "127.0.0.1:10250")
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("x")); err == nil {
		t.Fatal("write after CloseWrite succeeded")
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "ping" {
		t.Fatalf("read %q %v", got, err)
	}
	_ = c.Close()
	// Cloud closes without half-closing; the agent's echo sees EOF
	// and the session ends on both sides.
	c = e.dial(t, "127.0.0.1:10250")
	if _, err := c.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("read after Close succeeded")
	}
	noLeaks(t, e, g, subs)
}

// TestDialerLingers: the cloud closes first, so its session ends having
// acknowledged the agent's CLOSE only with a WINDOW frame. Were that lost,
// the agent would resend its CLOSE: the cloud's released session still
// answers it, with an ERROR (which ends the agent's side cleanly), until
// its linger has passed; then its subscription is gone.
func TestDialerLingers(t *testing.T) {
	e := start(t, tunnelproto.Config{})
	g, subs := settled(t, e)
	released := make(chan error, 1)
	e.dialer.OnDone = func(_ string, _ tunnelproto.Stats, err error) { released <- err }
	c := e.dial(t, "127.0.0.1:10250")
	id := c.Session()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(c); err != nil || string(got) != "ping" {
		t.Fatalf("read %q %v", got, err)
	}
	_ = c.Close()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("session ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cloud's end was not released")
	}
	in, _ := events.TunnelSubject("n1", id, events.ToEdge)
	out, _ := events.TunnelSubject("n1", id, events.ToCloud)
	answers, err := e.edg.SubscribeSync(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.edg.Flush(); err != nil {
		t.Fatal(err)
	}
	resent, _ := proto.Marshal(&atollv1.TunnelFrame{Session: id, Kind: atollv1.FrameKind_FRAME_KIND_CLOSE, Sequence: 3, Ack: 3})
	if err := e.edg.Publish(out, resent); err != nil {
		t.Fatal(err)
	}
	// The cloud's last ack may still be on its way; the ERROR follows.
	for {
		m, err := answers.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no ERROR for a CLOSE resent after the cloud's end was released: %v", err)
		}
		var f atollv1.TunnelFrame
		if err := proto.Unmarshal(m.Data, &f); err != nil || f.Session != id {
			t.Fatalf("answer %v %v, want a frame of session %s", &f, err, id)
		}
		if f.Kind == atollv1.FrameKind_FRAME_KIND_ERROR {
			break
		}
		if f.Kind != atollv1.FrameKind_FRAME_KIND_WINDOW {
			t.Fatalf("answer %v, want the last ack or an ERROR", &f)
		}
	}
	_ = answers.Unsubscribe()
	noLeaks(t, e, g, subs)
}

// TestDialWaitsForTheAgent: a session dialled while the node's agent is
// not listening (restarting) opens as soon as the agent subscribes: the
// agent announces itself and the Dialer resends the OPEN at once, not at
// its next resend (here 5 s away).
func TestDialWaitsForTheAgent(t *testing.T) {
	cfg := tunnelproto.Config{Resend: 5 * time.Second, MaxResend: 20 * time.Second}
	e := start(t, cfg)
	if err := e.ln.Close(); err != nil {
		t.Fatal(err)
	}
	type dialed struct {
		c   *tunnelproto.Conn
		err error
		at  time.Time
	}
	res := make(chan dialed, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := e.dialer.Dial(ctx, "n1", "echo")
		res <- dialed{c, err, time.Now()}
	}()
	time.Sleep(500 * time.Millisecond) // the first OPEN went nowhere
	listening := time.Now()
	ln, err := tunnelproto.Listen(e.edg, "n1", cfg, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if r, err := ln.Accept(context.Background()); err == nil {
			c := r.Accept()
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	select {
	case d := <-res:
		if d.err != nil {
			t.Fatalf("dial: %v", d.err)
		}
		defer d.c.Close()
		took := d.at.Sub(listening)
		if took >= cfg.Resend {
			t.Fatalf("the session opened %v after the agent listened: at the next resend, not at its announcement", took)
		}
		t.Logf("the session opened %v after the agent listened", took)
	case <-time.After(25 * time.Second):
		t.Fatal("the session never opened")
	}
}
