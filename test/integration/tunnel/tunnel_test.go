package tunnel_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/atoll-edge/atoll/cloud/tunnel"
	edgetunnel "github.com/atoll-edge/atoll/edge/tunnel"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

// echoServer is the kubelet stand-in: it echoes and passes half-closes on.
func echoServer(t testing.TB) string {
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
			go func() {
				defer c.Close()
				if _, err := io.Copy(c, c); err == nil {
					_ = c.(*net.TCPConn).CloseWrite()
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// helloServer writes hello and closes: the edge side ends the session.
func helloServer(t testing.TB) string {
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
			_, _ = c.Write([]byte("hello"))
			c.Close()
		}
	}()
	return ln.Addr().String()
}

type rig struct {
	hello       string
	agent       *edgetunnel.Agent
	kubelet     string
	kubeletPort string
	proxy       *natstest.Proxy
	servers     []*tunnel.Server
	serverNCs   []*nats.Conn
	serverRegs  []*prometheus.Registry
	agentReg    *prometheus.Registry
	agentNC     *nats.Conn
}

// setup: a hub; node n1's edge server (its own credentials) behind a
// cuttable leaf link with the real agent allowing only the kubelet stand-in;
// two tunnel server replicas on the hub, each with a CONNECT listener and a
// forward to the kubelet port of n1.
func setup(t testing.TB) *rig { return setupWith(t, echoServer(t), tunnel.Names{}, nil) }

// setupWith is setup with another kubelet and resolver; first, when set,
// changes the first replica's configuration (CONNECT on 127.0.0.1:0).
func setupWith(t testing.TB, kubelet string, res tunnel.Resolver, first func(*tunnel.Config)) *rig {
	return setupRig(t, rigOptions{kubelet: kubelet, res: res, first: first})
}

// rigOptions tune setupRig.
type rigOptions struct {
	kubelet string
	res     tunnel.Resolver
	first   func(*tunnel.Config)
	// directLeaf dials the hub's leaf port without the cuttable proxy
	// (r.proxy is then nil): the benchmarks.
	directLeaf bool
	// hubCompression is the leaf link's compression (empty: default).
	hubCompression string
	// tcp connects the replicas to the hub and the agent to its edge
	// server over loopback TCP instead of in process.
	serverTCP, agentTCP bool
	// allow are further targets the agent allows.
	allow []string
	// session changes both ends' session configuration.
	session func(*tunnelproto.Config)
	// apiserver is the kube-apiserver both replicas relay nodes'
	// connections to (tunnel.Config.APIServer), and has the agent
	// forward them (on r.agent.APIServerAddr()).
	apiserver string
}

// overTCP makes an in-process Connect dial url over TCP instead.
func overTCP(url string) nats.Option {
	return func(o *nats.Options) error {
		o.InProcessServer = nil
		o.Url, o.Servers = url, nil
		return nil
	}
}

func setupRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	h := natstest.Hub(t)
	r := &rig{kubelet: o.kubelet, agentReg: prometheus.NewRegistry()}
	_, r.kubeletPort, _ = net.SplitHostPort(r.kubelet)
	eo := natstest.EdgeOptions{HubCompression: o.hubCompression}
	if !o.directLeaf {
		r.proxy = natstest.NewProxy(t, h.LeafURL().Host)
		eo.HubURL = "nats-leaf://" + r.proxy.Addr()
	}
	n := natstest.Edge(t, h, "n1", eo)
	var agentOpts []nats.Option
	if o.agentTCP {
		agentOpts = append(agentOpts, overTCP(n.Server().ClientURL()))
	}
	var err error
	if r.agentNC, err = n.Connect("agent", agentOpts...); err != nil {
		t.Fatal(err)
	}
	acfg := edgetunnel.DefaultConfig()
	acfg.Kubelet = r.kubelet
	r.hello = helloServer(t)
	acfg.Allow = append([]string{r.hello}, o.allow...)
	if o.apiserver != "" {
		acfg.APIServerListen = "127.0.0.1:0"
	}
	if o.session != nil {
		o.session(&acfg.Session)
	}
	a, err := edgetunnel.New(acfg, "n1", edgetunnel.NewMetrics(r.agentReg), natstest.Logger(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	r.agent = a
	if err := a.Start(r.agentNC); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() {
		_ = a.Stop(context.Background())
		cancel()
		<-done
		r.agentNC.Close()
	})
	for i := 0; i < 2; i++ {
		var serverOpts []nats.Option
		if o.serverTCP {
			serverOpts = append(serverOpts, overTCP(h.ClientURL()))
		}
		nc, err := h.Connect(fmt.Sprintf("tunnel-%d", i), serverOpts...)
		if err != nil {
			t.Fatal(err)
		}
		cfg := tunnel.DefaultConfig()
		cfg.ConnectAddr = "127.0.0.1:0"
		cfg.APIServer = o.apiserver
		if i == 0 && o.first != nil {
			o.first(&cfg)
		}
		cfg.Forwards = []tunnel.Forward{{Listen: "127.0.0.1:0", Node: "n1", Target: "localhost:" + r.kubeletPort}}
		cfg.Session.KeepAlive, cfg.Session.LinkTimeout = 500*time.Millisecond, 8*time.Second
		if o.session != nil {
			o.session(&cfg.Session)
		}
		reg := prometheus.NewRegistry()
		s, err := tunnel.New(cfg, o.res, tunnel.NewMetrics(reg), natstest.Logger(t, 0))
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Start(nc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Stop(context.Background()); nc.Close() })
		r.servers = append(r.servers, s)
		r.serverNCs = append(r.serverNCs, nc)
		r.serverRegs = append(r.serverRegs, reg)
	}
	return r
}

// connect sends CONNECT host:port to replica i and returns the raw
// connection after a 200, or the status and body.
func (r *rig) connect(t testing.TB, i int, hostport string) (net.Conn, int, string) {
	t.Helper()
	c, err := net.Dial("tcp", r.servers[i].Addrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", hostport, hostport)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", hostport, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		c.Close()
		return nil, resp.StatusCode, string(body)
	}
	return &readerConn{Conn: c, r: br}, resp.StatusCode, ""
}

// readerConn reads what followed the CONNECT response first.
type readerConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readerConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *readerConn) CloseWrite() error          { return c.Conn.(*net.TCPConn).CloseWrite() }

// echo sends n random bytes through c, half-closes and checks the echo.
func echo(t *testing.T, c net.Conn, n int, mid func()) {
	t.Helper()
	if err := echoed(c, n, mid); err != nil {
		t.Fatal(err)
	}
}

// echoed is echo for goroutines other than the test's: it returns what
// went wrong.
func echoed(c net.Conn, n int, mid func()) error {
	const chunk = 256 << 10
	errc := make(chan error, 1)
	go func() {
		src, buf := newPattern(uint64(n)), make([]byte, chunk)
		for off := 0; off < n; off += chunk {
			if mid != nil && off >= n/2 && off-chunk < n/2 {
				mid()
			}
			p := buf[:min(chunk, n-off)]
			src.fill(p)
			if _, err := c.Write(p); err != nil {
				errc <- err
				return
			}
		}
		errc <- c.(interface{ CloseWrite() error }).CloseWrite()
	}()
	// The bytes read back are compared with the same pattern as they
	// arrive, so that a GiB needs no GiB of memory.
	want, got, exp, off := newPattern(uint64(n)), make([]byte, chunk), make([]byte, chunk), 0
	for {
		k, err := c.Read(got)
		if k > 0 {
			if off+k > n {
				return fmt.Errorf("echo: %d bytes read back, more than the %d written", off+k, n)
			}
			want.fill(exp[:k])
			if i := firstDiff(got[:k], exp[:k]); i >= 0 {
				return fmt.Errorf("echo differs at byte %d of %d", off+i, n)
			}
			off += k
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read after %d of %d bytes: %w", off, n, err)
		}
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if off != n {
		return fmt.Errorf("echo ended after %d bytes, want %d", off, n)
	}
	return nil
}

// pattern is a reproducible stream of pseudo-random bytes: the writer and
// the reader of an echo each make one from the same seed.
type pattern struct {
	rng  *rand.PCG
	word [8]byte
	left int
}

func newPattern(seed uint64) *pattern { return &pattern{rng: rand.NewPCG(seed, 9)} }

func (p *pattern) fill(b []byte) {
	for i := range b {
		if p.left == 0 {
			binary.LittleEndian.PutUint64(p.word[:], p.rng.Uint64())
			p.left = 8
		}
		b[i] = p.word[8-p.left]
		p.left--
	}
}

func firstDiff(a, b []byte) int {
	if bytes.Equal(a, b) {
		return -1
	}
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return len(a)
}

func TestConnectByteIdentical(t *testing.T) {
	r := setup(t)
	c, code, body := r.connect(t, 0, "n1:"+r.kubeletPort)
	if c == nil {
		t.Fatalf("CONNECT: %d %s", code, body)
	}
	defer c.Close()
	echo(t, c, 32<<20, nil)
}

func TestForwardByteIdentical(t *testing.T) {
	r := setup(t)
	c, err := net.Dial("tcp", r.servers[1].Addrs()[1].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, 8<<20, nil)
}

func TestRefusedTarget(t *testing.T) {
	r := setup(t)
	_, code, body := r.connect(t, 0, "n1:22")
	if code != http.StatusBadGateway || !strings.Contains(body, `target "n1:22" not allowed on node n1`) {
		t.Fatalf("CONNECT n1:22: %d %q, want 502 naming the refused target", code, body)
	}
	if v := testutil.ToFloat64(mustCounter(t, r.agentReg, "atoll_tunnel_agent_refused_targets_total")); v != 1 {
		t.Fatalf("refused counter %v, want 1", v)
	}
	_, code, _ = r.connect(t, 0, "a*b:10250")
	if code != http.StatusNotFound {
		t.Fatalf("CONNECT to an invalid node: %d, want 404", code)
	}
}

func mustCounter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return mf.GetMetric()[0].GetCounter().GetValue() })
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestManyConcurrentSessions: 1,000 concurrent sessions over both
// replicas (ATOLL_TUNNEL_SESSIONS sets another count).
func TestManyConcurrentSessions(t *testing.T) {
	r := setup(t)
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("ATOLL_TUNNEL_SESSIONS")); err == nil {
		n = v
	}
	before := runtime.NumGoroutine()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, code, body := r.connect(t, i%2, "n1:"+r.kubeletPort)
			if c == nil {
				t.Errorf("CONNECT %d: %d %s", i, code, body)
				return
			}
			defer c.Close()
			if err := echoed(c, 20_000+i, nil); err != nil {
				t.Errorf("session %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	noLeaks(t, r, before)
}

// noLeaks waits until the agent holds no session and the goroutines are
// back to the count before.
func noLeaks(t *testing.T, r *rig, goroutines int) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, func() error {
		if v := gauge(t, r.agentReg, "atoll_tunnel_agent_sessions"); v != 0 {
			return fmt.Errorf("agent relays %v sessions", v)
		}
		if n := runtime.NumGoroutine(); n > goroutines {
			return fmt.Errorf("%d goroutines, %d before", n, goroutines)
		}
		return nil
	})
}

// TestCloseFromEachSide: the edge target closing ends the session at the
// client (EOF after every byte); the client closing ends it at the target.
func TestCloseFromEachSide(t *testing.T) {
	r := setup(t)
	before := runtime.NumGoroutine()
	_, helloPort, _ := net.SplitHostPort(r.hello)
	c, code, body := r.connect(t, 0, "n1:"+helloPort)
	if c == nil {
		t.Fatalf("CONNECT: %d %s", code, body)
	}
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello" {
		t.Fatalf("read %q %v", got, err)
	}
	c.Close()
	// The client closes at once, without half-closing first.
	for i := 0; i < 20; i++ {
		c, _, _ = r.connect(t, i%2, "n1:"+r.kubeletPort)
		if c == nil {
			t.Fatal("CONNECT failed")
		}
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	noLeaks(t, r, before)
}

// TestGiB moves 1 GiB each way of raw TCP through a port forward, byte
// for byte (echo checks every byte it reads back).
func TestGiB(t *testing.T) {
	r := setup(t)
	c, err := net.Dial("tcp", r.servers[1].Addrs()[1].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo(t, c, 1<<30, nil)
}

// TestLeafDroppedMidTransfer: the node's leaf link is cut for 5 s in the
// middle of a CONNECT transfer; it completes byte for byte.
func TestLeafDroppedMidTransfer(t *testing.T) {
	r := setup(t)
	c, code, body := r.connect(t, 0, "n1:"+r.kubeletPort)
	if c == nil {
		t.Fatalf("CONNECT: %d %s", code, body)
	}
	defer c.Close()
	echo(t, c, 32<<20, func() {
		r.proxy.Cut()
		time.AfterFunc(5*time.Second, r.proxy.Restore)
	})
}

// TestReplicaKilled: replica 0 dies (its hub connection drops without a
// goodbye) mid-session; a session through replica 1 carries on, new
// sessions through replica 1 succeed at once, and the agent drops the dead
// replica's session by itself.
func TestReplicaKilled(t *testing.T) {
	r := setup(t)
	dead, _, _ := r.connect(t, 0, "n1:"+r.kubeletPort)
	live, _, _ := r.connect(t, 1, "n1:"+r.kubeletPort)
	if dead == nil || live == nil {
		t.Fatal("CONNECT failed")
	}
	defer dead.Close()
	defer live.Close()
	if _, err := live.Write([]byte("before")); err != nil {
		t.Fatal(err)
	}
	r.serverNCs[0].Close()
	start := time.Now()
	c, code, body := r.connect(t, 1, "n1:"+r.kubeletPort)
	if c == nil {
		t.Fatalf("new CONNECT through the live replica: %d %s", code, body)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("new session took %s", d)
	}
	echo(t, c, 1<<20, nil)
	c.Close()
	if _, err := live.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len("beforeafter"))
	if _, err := io.ReadFull(live, buf); err != nil || string(buf) != "beforeafter" {
		t.Fatalf("live session read %q %v", buf, err)
	}
	// The agent's end of the dead replica's session ends after LinkTimeout.
	poll.Eventually(t, 20*time.Second, func() error {
		if v := gauge(t, r.agentReg, "atoll_tunnel_agent_sessions"); v != 1 {
			return fmt.Errorf("agent relays %v sessions, want 1 (the live one)", v)
		}
		return nil
	})
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}
