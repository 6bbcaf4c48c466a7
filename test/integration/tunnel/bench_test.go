package tunnel_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	cloudtunnel "github.com/atoll-edge/atoll/cloud/tunnel"
	"github.com/atoll-edge/atoll/internal/tunnelproto"
)

// The tunnel benchmarks run the hub, the node's edge server, the agent and
// two server replicas in this process (see setup; the leaf link dials the
// hub directly, without the tests' cuttable proxy), against the same echo
// target reached three ways: direct loopback TCP, a plain HTTP CONNECT
// proxy without NATS, and the tunnel. Run on a quiet machine:
//
//	go test -run XXX -bench . -benchtime 5s ./cloud/tunnel/
//
// Bulk: one stream in one direction at a time, the metric (see
// BenchmarkBulk; it prints its table of ratios). Throughput: MB/s of each
// direction of an echo while both run at once. Latency: p50/p99 of a 100-byte
// round trip on an open connection. SessionOpen: CONNECT, one byte each
// way, close (and p50 of CONNECT → 200, the session's opening). IdleSessionMemory: heap per open idle session, both ends
// (server and agent) counted, since both run here.

// benchRig is setup with the leaf link dialling the hub directly, as in
// production (the tests' cuttable proxy would add a TCP hop and a copy).
func benchRig(b *testing.B) *rig {
	return setupRig(b, rigOptions{kubelet: echoServer(b), res: cloudtunnel.Names{}, directLeaf: true})
}

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
		tunnelproto.Pipe(&readerConn{Conn: raw, r: buf.Reader}, c)
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
	r := benchRig(b)
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
	r := benchRig(b)
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
	r := benchRig(b)
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

// bulkServer is the one-way target: a client sends 'U' and an 8-byte
// length, then that many bytes, which it discards before answering one
// byte; or 'D' and a length, and it sends that many bytes and closes.
func bulkServer(b *testing.B, data []byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var hdr [9]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				n := int64(binary.BigEndian.Uint64(hdr[1:]))
				switch hdr[0] {
				case 'U':
					if m, err := io.CopyN(io.Discard, c, n); err == nil && m == n {
						_, _ = c.Write([]byte{1})
					}
				case 'D':
					_, _ = io.Copy(c, &repeatReader{data: data, left: n})
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// repeatReader reads left bytes of data, over and over.
type repeatReader struct {
	data []byte
	off  int
	left int64
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > r.left {
		p = p[:r.left]
	}
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	r.left -= int64(n)
	return n, nil
}

// WriteTo writes in 64 KiB pieces, as an application would.
func (r *repeatReader) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for r.left > 0 {
		n := min(int64(64<<10), r.left, int64(len(r.data)-r.off))
		m, err := w.Write(r.data[r.off : r.off+int(n)])
		total += int64(m)
		r.left -= int64(m)
		r.off = (r.off + m) % len(r.data)
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// bulkVariant is a tunnel configuration BenchmarkBulk measures.
type bulkVariant struct {
	name string
	opts rigOptions
}

// bulkVariants: the tunnel as configured by default first, then the
// A/B variants, run when ATOLL_TUNNEL_BENCH_VARIANTS=all (or a
// comma-separated list of names).
var bulkVariants = []bulkVariant{
	{name: "tunnel"},
	{name: "tunnel-s2auto", opts: rigOptions{hubCompression: "s2_auto"}},
	{name: "tunnel-tcp", opts: rigOptions{serverTCP: true, agentTCP: true}},
	{name: "tunnel-leafproxy", opts: rigOptions{directLeaf: false}},
	{name: "tunnel-win4m", opts: rigOptions{session: func(c *tunnelproto.Config) { c.Window, c.SendBuffer = 4<<20, 2<<20 }}},
	{name: "tunnel-frame512k", opts: rigOptions{session: func(c *tunnelproto.Config) { c.MaxFrame = 512 << 10 }}},
	{name: "tunnel-frame128k", opts: rigOptions{session: func(c *tunnelproto.Config) { c.MaxFrame = 128 << 10 }}},
	{name: "tunnel-frame30k", opts: rigOptions{session: func(c *tunnelproto.Config) { c.MaxFrame = 30 << 10 }}},
}

func selectedVariants() []bulkVariant {
	sel := os.Getenv("ATOLL_TUNNEL_BENCH_VARIANTS")
	var out []bulkVariant
	for i, v := range bulkVariants {
		if i == 0 || sel == "all" || slices.Contains(strings.Split(sel, ","), v.name) {
			if v.name != "tunnel-leafproxy" {
				v.opts.directLeaf = true
			}
			out = append(out, v)
		}
	}
	return out
}

// BenchmarkBulk is the metric: one bulk stream in one direction
// (up: cloud → edge, down: edge → cloud) of ATOLL_TUNNEL_BENCH_MIB
// (default 256) MiB of random bytes (incompressible, like the TLS of a
// kubelet session), per operation, directly over loopback TCP, through
// the plain CONNECT proxy and through the tunnel (and its A/B variants,
// see bulkVariants), each in its own rig with the leaf link dialling the
// hub directly. It prints MB/s and the ratios to direct and to the plain
// proxy measured in the same run.
func BenchmarkBulk(b *testing.B) {
	size := benchBytes(b, "ATOLL_TUNNEL_BENCH_MIB", 256)
	data := randomBytes(4<<20, 1)
	target := bulkServer(b, data)
	proxy := plainProxy(b)
	_, port, _ := net.SplitHostPort(target)
	dial := map[string]func() net.Conn{
		"direct": func() net.Conn {
			c, err := net.Dial("tcp", target)
			if err != nil {
				b.Fatal(err)
			}
			return c
		},
		"connect-proxy": func() net.Conn { return connectVia(b, proxy, target) },
	}
	names := []string{"direct", "connect-proxy"}
	for _, v := range selectedVariants() {
		o := v.opts
		o.kubelet, o.res = target, cloudtunnel.Names{}
		r := setupRig(b, o)
		addr := r.servers[0].Addrs()[0].String()
		dial[v.name] = func() net.Conn { return connectVia(b, addr, "n1:"+port) }
		names = append(names, v.name)
	}
	// Each sub-benchmark runs -count times within this one call: the
	// table has the median of the runs (and their range).
	mbps, cpu := map[string][]float64{}, map[string][]float64{}
	for _, dir := range []string{"up", "down"} {
		for _, name := range names {
			b.Run(dir+"/"+name, func(b *testing.B) {
				b.SetBytes(size)
				c0 := cpuTime()
				for i := 0; i < b.N; i++ {
					bulkOnce(b, dial[name](), dir, size, data)
				}
				c := (cpuTime() - c0).Seconds() * 1e6 / float64(size*int64(b.N)>>20)
				b.ReportMetric(c, "cpu-µs/MiB")
				if b.N > 1 || b.Elapsed() > time.Second { // not the 1-op probe
					mbps[dir+"/"+name] = append(mbps[dir+"/"+name], float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e6)
					cpu[dir+"/"+name] = append(cpu[dir+"/"+name], c)
				}
			})
		}
	}
	fmt.Printf("\nBulk: one stream of %d MiB each way, random bytes, GOMAXPROCS=%d; median of %d runs (min–max)\n",
		size>>20, runtime.GOMAXPROCS(0), len(mbps["up/direct"]))
	fmt.Printf("%-18s %-4s %-16s %7s %7s %-17s %7s\n", "path", "dir", "MB/s", "/direct", "/proxy", "cpu-µs/MiB", "/direct")
	for _, dir := range []string{"up", "down"} {
		d, p, dc := median(mbps[dir+"/direct"]), median(mbps[dir+"/connect-proxy"]), median(cpu[dir+"/direct"])
		for _, name := range names {
			m, c := mbps[dir+"/"+name], cpu[dir+"/"+name]
			fmt.Printf("%-18s %-4s %-16s %6.2fx %6.2fx %-17s %6.2fx\n", name, dir, spread(m), median(m)/d, median(m)/p, spread(c), median(c)/dc)
		}
	}
}

// benchBytes is the size in MiB environment variable env sets, def
// when it is not set, in bytes.
func benchBytes(b *testing.B, env string, def int) int64 {
	mib := def
	if s := os.Getenv(env); s != "" {
		var err error
		if mib, err = strconv.Atoi(s); err != nil || mib <= 0 {
			b.Fatalf("%s=%q: not a positive number", env, s)
		}
	}
	return int64(mib) << 20
}

// randomBytes is n incompressible bytes, the same for the same seed.
func randomBytes(n int, seed uint64) []byte {
	data := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, seed+1))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	return data
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	return s[len(s)/2]
}

// spread is "median (min–max)".
func spread(v []float64) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", median(v), slices.Min(v), slices.Max(v))
}

// cpuTime is the CPU time (user and system) this process used so far:
// every hop of every path runs in it, so CPU per byte compares the paths
// even on a machine other work slows down.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// bulkOnce moves size bytes over c in direction dir and closes c.
func bulkOnce(b *testing.B, c net.Conn, dir string, size int64, data []byte) {
	defer c.Close()
	var hdr [9]byte
	binary.BigEndian.PutUint64(hdr[1:], uint64(size))
	switch dir {
	case "up":
		hdr[0] = 'U'
		if _, err := c.Write(hdr[:]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(c, &repeatReader{data: data, left: size}); err != nil {
			b.Fatal(err)
		}
		var ack [1]byte
		if _, err := io.ReadFull(c, ack[:]); err != nil {
			b.Fatalf("up: no acknowledgement of %d bytes: %v", size, err)
		}
	case "down":
		hdr[0] = 'D'
		if _, err := c.Write(hdr[:]); err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, c)
		if err != nil || n != size {
			b.Fatalf("down: received %d of %d bytes: %v", n, size, err)
		}
	}
}
