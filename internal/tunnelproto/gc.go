package tunnelproto

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// While a session streams, the NATS libraries on its path copy every
// frame they receive into a new allocation: nats-server's parser each
// message that spans its reads (all of them behind a TLS leaf link, whose
// reads return one 16 KiB record), nats.go's parser every message. In a
// process whose live heap is small the collector then runs every few
// megabytes, a quarter of the tunnel's CPU per byte as deployed
// (bench:tunnel:peers). So while bytes stream, the GC target is raised
// until the heap may grow by gcHeadroom beyond the live heap (GOGC at
// most gcMaxPercent), and one second after the last bulk read or frame
// it goes back. A process whose live heap is large already collects
// rarely per byte and gets little or no raise; the memory it costs is
// bounded by gcHeadroom, and only while a stream runs.
const (
	gcHeadroom   = 64 << 20
	gcMaxPercent = 400
	gcIdle       = time.Second
)

var streamGC = &gcBoost{headroom: gcHeadroom, maxPercent: gcMaxPercent, idle: gcIdle, live: liveHeap}

// gcBoost raises the process's GC percent while streaming is called, and
// restores it once it is not called for idle.
type gcBoost struct {
	headroom   uint64
	maxPercent int
	idle       time.Duration
	live       func() uint64

	last atomic.Int64 // UnixNano of the last streaming call
	on   atomic.Bool

	mu    sync.Mutex
	base  int // the GC percent before the raise
	set   int // the GC percent this set
	timer *time.Timer
}

// streaming notes that a session moves bulk bytes now: cheap (two atomic
// operations) except for the call that starts a raise.
func (g *gcBoost) streaming() {
	g.last.Store(time.Now().UnixNano())
	if g.on.Load() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.on.Load() {
		return
	}
	g.base = debug.SetGCPercent(100)
	debug.SetGCPercent(g.base)
	g.set = g.base
	g.adjust()
	g.on.Store(true)
	g.timer = time.AfterFunc(g.idle, g.tick)
}

// tick restores the GC percent once streaming was not called for idle,
// and else follows the live heap.
func (g *gcBoost) tick() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(time.Unix(0, g.last.Load())) >= g.idle {
		if g.set != g.base {
			debug.SetGCPercent(g.base)
		}
		g.on.Store(false)
		return
	}
	g.adjust()
	g.timer.Reset(g.idle)
}

// adjust sets the GC percent that lets the heap grow by headroom beyond
// the live heap, between base and maxPercent; with the collector off
// (base < 0) it leaves it off.
func (g *gcBoost) adjust() {
	if g.base < 0 {
		return
	}
	want := g.percent(g.live())
	if want != g.set {
		debug.SetGCPercent(want)
		g.set = want
	}
}

// percent is the GC percent for a live heap of live bytes.
func (g *gcBoost) percent(live uint64) int {
	p := g.maxPercent
	if live > 0 && g.headroom*100/live < uint64(p) {
		p = int(g.headroom * 100 / live)
	}
	return max(p, g.base)
}

// liveHeap is the heap the last collection marked live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
