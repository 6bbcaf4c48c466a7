package tunnel_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/events/tunnel"
)

// The tunnel benchmarks run the hub, the node's edge server, the agent and
// two server replicas in this process (see setup), against the same echo
// target reached three ways: direct loopback TCP, a plain HTTP CONNECT
// proxy without NATS, and the tunnel. Run on a quiet machine:
//
//	go test -run XXX -bench . -benchtime 5s ./cloud/tunnel/
//
// Throughput: MB/s of each direction while both run at once (the ratio
// tunnel/direct is the README's number). Latency: p50/p99 of a 100-byte
// round trip on an open connection. SessionOpen: CONNECT, one byte each
// way, close (and p50 of CONNECT → 200, the session's opening). IdleSessionMemory: heap per open idle session, both ends
// (server and agent) counted, since both run here.

// plainProxy is a CONNECT proxy without NATS: the second baseline.
func plainProxy(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		raw, buf, err := w.(http.Hijacker).Hijack()
		if err != nil {
			c.Close()
			return
		}
		tunnel.Pipe(&readerConn{Conn: raw, r: buf.Reader}, c)
	})}
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func connectVia(b *testing.B, proxy, target string) net.Conn {
	c, err := net.Dial("tcp", proxy)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("CONNECT %s via %s: %v", target, proxy, err)
	}
	return &readerConn{Conn: c, r: br}
}

// paths opens a connection to the echo target each of the three ways.
func paths(b *testing.B) map[string]func() net.Conn {
	r := setup(b)
	proxy := plainProxy(b)
	return map[string]func() net.Conn{
		"direct": func() net.Conn {
			c, err := net.Dial("tcp", r.kubelet)
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		"connect-proxy": func() net.Conn { return connectVia(b, proxy, r.kubelet) },
		"tunnel":        func() net.Conn { return connectVia(b, r.servers[0].Addrs()[0].String(), "n1:"+r.kubeletPort) },
	}
}

var pathOrder = []string{"direct", "connect-proxy", "tunnel"}

func BenchmarkThroughput(b *testing.B) {
	ps := paths(b)
	chunk := make([]byte, 64<<10)
	for _, name := range pathOrder {
		b.Run(name, func(b *testing.B) {
			c := ps[name]()
			defer c.Close()
			b.SetBytes(int64(len(chunk)))
			b.ResetTimer()
			go func() {
				for i := 0; i < b.N; i++ {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
				_ = c.(interface{ CloseWrite() error }).CloseWrite()
			}()
			n, err := io.Copy(io.Discard, c)
			if err != nil || n != int64(b.N*len(chunk)) {
				b.Fatalf("echoed %d of %d: %v", n, b.N*len(chunk), err)
			}
		})
	}
}

func BenchmarkLatency(b *testing.B) {
	ps := paths(b)
	msg := make([]byte, 100)
	for _, name := range pathOrder {
		b.Run(name, func(b *testing.B) {
			c := ps[name]()
			defer c.Close()
			lat := make([]time.Duration, 0, b.N)
			buf := make([]byte, len(msg))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

func BenchmarkSessionOpen(b *testing.B) {
	r := setup(b)
	addr := r.servers[0].Addrs()[0].String()
	one := []byte{1}
	opens := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		c := connectVia(b, addr, "n1:"+r.kubeletPort)
		opens = append(opens, time.Since(t0))
		if _, err := c.Write(one); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, one); err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "sessions/s")
	slices.Sort(opens)
	b.ReportMetric(float64(opens[len(opens)/2].Microseconds()), "connect-p50-µs")
}

func BenchmarkIdleSessionMemory(b *testing.B) {
	r := setup(b)
	const n = 500
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	conns := make([]net.Conn, 0, n)
	for i := 0; i < n; i++ {
		conns = append(conns, connectVia(b, r.servers[0].Addrs()[0].String(), "n1:"+r.kubeletPort))
	}
	time.Sleep(time.Second) // let the sessions settle into idle keepalives
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-bytes/session")
	for _, c := range conns {
		c.Close()
	}
}
