package tunnel_test

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// TestBrokenSessionsAreResets: a session that breaks never looks
// complete to the client. A target that resets its connection after a
// few bytes, and a session lost to the link timeout (the leaf link's
// packets dropped), each reach the CONNECT client as a TCP reset after the
// bytes that made it, not as an end of stream.
func TestBrokenSessionsAreResets(t *testing.T) {
	resetter := resettingServer(t)
	_, resetPort, _ := net.SplitHostPort(resetter)
	r := setupRig(t, rigOptions{kubelet: echoServer(t), res: tunnel.Names{}, allow: []string{resetter},
		session: func(c *tunnelproto.Config) { c.KeepAlive, c.LinkTimeout = 250*time.Millisecond, 2*time.Second }})

	t.Run("the target resets", func(t *testing.T) {
		c, code, body := r.connect(t, 0, "n1:"+resetPort)
		if c == nil {
			t.Fatalf("CONNECT: %d %s", code, body)
		}
		defer c.Close()
		got, err := io.ReadAll(c)
		if string(got) != "partial" || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("read %q, %v: want the bytes sent, then a reset", got, err)
		}
	})
	t.Run("the link is lost", func(t *testing.T) {
		c, code, body := r.connect(t, 0, "n1:"+r.kubeletPort)
		if c == nil {
			t.Fatalf("CONNECT: %d %s", code, body)
		}
		defer c.Close()
		if _, err := c.Write([]byte("before")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len("before"))
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		r.proxy.Stall()
		defer r.proxy.Restore()
		_, err := io.ReadAll(c)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("a session lost to the link timeout read %v, want a reset", err)
		}
	})
}

// resettingServer writes "partial" to each connection and resets it.
func resettingServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("partial"))
			time.Sleep(100 * time.Millisecond) // the bytes go first
			_ = c.(*net.TCPConn).SetLinger(0)
			_ = c.Close()
		}
	}()
	return ln.Addr().String()
}
