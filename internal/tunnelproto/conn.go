package tunnelproto

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Addr is a tunnel endpoint address: node and target.
type Addr struct{ Node, Target string }

// Network is "tunnel".
func (Addr) Network() string  { return "tunnel" }
func (a Addr) String() string { return a.Node + "/" + a.Target }

// Conn is a net.Conn over a Session: Read and Write block on the
// session's buffers; one timer drives resends, keepalives and timeouts. It
// starts no goroutine. After Close the session lingers (CLOSE sent, reads
// discarded) until the peer has everything or LinkTimeout passes, then
// release is called once.
type Conn struct {
	mu      sync.Mutex
	cond    *sync.Cond
	s       *Session
	send    func(*atollv1.TunnelFrame)
	release func(*Conn)
	timer   *time.Timer
	closed  bool
	gone    bool // released
	lingerT time.Time
	local   Addr
	remote  Addr

	readDL, writeDL       time.Time
	readTimer, writeTimer *time.Timer
	established           chan struct{}
	estOnce               sync.Once
}

func newConn(s *Session, send func(*atollv1.TunnelFrame), release func(*Conn), local, remote Addr) *Conn {
	c := &Conn{s: s, send: send, release: release, local: local, remote: remote, established: make(chan struct{})}
	c.cond = sync.NewCond(&c.mu)
	c.timer = time.AfterFunc(time.Hour, c.onTimer)
	return c
}

// Session is the session identifier.
func (c *Conn) Session() string { return c.s.ID() }

// Stats is a copy of the session's counters.
func (c *Conn) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s.Stats()
}

func (c *Conn) onTimer() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.closed && !c.lingerT.IsZero() && now.After(c.lingerT) {
		c.s.Abort("closed")
	}
	c.s.Tick(now)
	c.flushLocked(now)
}

// nudge resends at once what the peer has not acknowledged, while the
// session waits for the peer's OPEN.
func (c *Conn) nudge() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok, _ := c.s.Opened(); ok || c.s.Done() {
		return
	}
	c.s.ResendNow()
	c.flushLocked(time.Now())
}

// receive feeds a frame from the peer.
func (c *Conn) receive(f *atollv1.TunnelFrame) {
	if len(f.GetPayload()) >= bulkRead {
		streamGC.streaming()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	c.s.Receive(f, now)
	c.flushLocked(now)
}

// flushLocked sends due frames, wakes waiters, re-arms the timer and
// releases a finished session.
func (c *Conn) flushLocked(now time.Time) {
	if c.gone {
		return
	}
	for _, f := range c.s.Outgoing(now) {
		c.send(f)
	}
	if ok, _ := c.s.Opened(); ok || c.s.Done() {
		c.estOnce.Do(func() { close(c.established) })
	}
	c.cond.Broadcast()
	if c.s.Done() {
		c.gone = true
		c.timer.Stop()
		c.stopDeadlineTimers()
		if c.release != nil {
			c.release(c)
		}
		return
	}
	d := c.s.Deadline()
	if !c.lingerT.IsZero() && c.lingerT.Before(d) {
		d = c.lingerT
	}
	c.timer.Reset(max(time.Until(d), time.Millisecond))
}

// waitEstablished blocks until the peer's OPEN or a failure.
func (c *Conn) waitEstablished(ctx context.Context) error {
	select {
	case <-c.established:
	case <-ctx.Done():
		c.Abort("dial: " + ctx.Err().Error())
		return ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s.Err()
}

// Read implements net.Conn; io.EOF after the peer's half-close.
func (c *Conn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return 0, net.ErrClosed
		}
		if len(p) == 0 {
			return 0, nil
		}
		if n := c.s.Read(p); n > 0 {
			c.flushLocked(time.Now())
			return n, nil
		}
		if c.s.PeerClosed() {
			return 0, io.EOF
		}
		if err := c.s.Err(); err != nil {
			return 0, err
		}
		if !c.readDL.IsZero() && !time.Now().Before(c.readDL) {
			return 0, os.ErrDeadlineExceeded
		}
		c.cond.Wait()
	}
}

// Write implements net.Conn; it returns once every byte is buffered.
func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	done := 0
	for done < len(p) {
		if c.closed {
			return done, net.ErrClosed
		}
		if err := c.s.Err(); err != nil {
			return done, err
		}
		if c.s.wantFin || c.s.finished {
			return done, ErrClosed
		}
		if !c.writeDL.IsZero() && !time.Now().Before(c.writeDL) {
			return done, os.ErrDeadlineExceeded
		}
		now := time.Now()
		n := c.s.Write(p[done:], now)
		done += n
		if n > 0 {
			c.flushLocked(now)
			continue
		}
		c.cond.Wait()
	}
	return done, nil
}

// CloseWrite half-closes: the peer reads EOF after the bytes written.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.s.CloseWrite()
	c.flushLocked(time.Now())
	return nil
}

// Close ends this end: written bytes are still delivered, unread and
// later bytes are discarded, and the session is released once both ends
// closed (or after LinkTimeout).
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return net.ErrClosed
	}
	c.closed = true
	c.s.CloseWrite()
	c.s.Discard()
	c.lingerT = time.Now().Add(c.s.cfg.LinkTimeout)
	c.flushLocked(time.Now())
	return nil
}

// Abort fails the session at once, telling the peer reason.
func (c *Conn) Abort(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.s.Abort(reason)
	c.flushLocked(time.Now())
}

// Err is the session's failure, if any.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.s.Err()
}

// LocalAddr implements net.Conn.
func (c *Conn) LocalAddr() net.Addr { return c.local }

// RemoteAddr implements net.Conn.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.readDL = t
	c.readTimer = c.armDeadline(c.readTimer, t)
	return nil
}

// SetWriteDeadline implements net.Conn.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeDL = t
	c.writeTimer = c.armDeadline(c.writeTimer, t)
	return nil
}

func (c *Conn) armDeadline(tm *time.Timer, t time.Time) *time.Timer {
	if tm != nil {
		tm.Stop()
	}
	c.cond.Broadcast()
	if t.IsZero() || c.gone {
		return nil
	}
	return time.AfterFunc(time.Until(t), func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
}

func (c *Conn) stopDeadlineTimers() {
	for _, t := range []*time.Timer{c.readTimer, c.writeTimer} {
		if t != nil {
			t.Stop()
		}
	}
}

// ReadFrom implements io.ReaderFrom, so io.Copy into a Conn (Pipe) reads
// in large pieces while data streams, and holds little while the session
// idles: it waits with a small buffer of its own and, once a read fills
// it (a bulk stream), reads into a MaxFrame buffer and lends each read's
// bytes to the session as they are (no copy into the send queue; a read
// that follows the last one in the same buffer grows its chunk, so a TLS
// source's 16 KiB records leave as frames of up to MaxFrame; the buffer
// comes back once every frame cut from it is acknowledged, see
// frameBuf). The next read goes where the last ended, into a new buffer
// when less than bulkRead is left; a read of less than half of bulkRead
// ends the burst (the session idles with the small buffer only). While
// it streams, the GC target is raised (see gcBoost).
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	small := make([]byte, idleReadBuffer)
	var fb *frameBuf // the bulk read buffer, referenced by ReadFrom too
	off := 0         // where the next read into fb goes
	defer func() { c.dropReadBuf(fb) }()
	bulk := false
	var total int64
	for {
		buf := small
		if bulk {
			if fb != nil && len(fb.b)-off < bulkRead {
				c.dropReadBuf(fb)
				fb = nil
			}
			if fb == nil {
				fb, off = getFrameBuf(c.s.cfg.MaxFrame), 0
				fb.ref()
			}
			buf = fb.b[off:]
		}
		n, err := r.Read(buf)
		if n > 0 {
			var werr error
			if bulk {
				streamGC.streaming()
				werr = c.writeBuf(fb, off, off+n)
				off += n
			} else {
				_, werr = c.Write(buf[:n])
			}
			if werr != nil {
				return total, werr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		switch {
		case !bulk && n == len(buf) && c.s.cfg.MaxFrame >= bulkRead:
			bulk = true
		case bulk && n < bulkRead/2:
			bulk = false
			c.dropReadBuf(fb) // idle sessions hold the small buffer only
			fb = nil
		}
	}
}

// dropReadBuf drops ReadFrom's reference to its read buffer: it goes
// back to the pool once no frame or queued chunk refers to it either.
func (c *Conn) dropReadBuf(fb *frameBuf) {
	if fb == nil {
		return
	}
	c.mu.Lock()
	fb.unref()
	c.mu.Unlock()
}

// writeBuf is Write of fb.b[start:end], lent to the session once the
// send buffer has room for all of it (else copied).
func (c *Conn) writeBuf(fb *frameBuf, start, end int) error {
	if end-start > c.s.cfg.SendBuffer {
		_, err := c.Write(fb.b[start:end])
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return net.ErrClosed
		}
		if err := c.s.Err(); err != nil {
			return err
		}
		if c.s.wantFin || c.s.finished {
			return ErrClosed
		}
		if !c.writeDL.IsZero() && !time.Now().Before(c.writeDL) {
			return os.ErrDeadlineExceeded
		}
		now := time.Now()
		if c.s.writeBuf(fb, start, end, now) {
			c.flushLocked(now)
			return nil
		}
		c.cond.Wait()
	}
}

// idleReadBuffer is what ReadFrom holds per session while it waits.
const idleReadBuffer = 4 << 10

// bulkRead is the least room ReadFrom offers a read of a bulk stream:
// a TLS record's plaintext (16 KiB), all a TLS connection returns per
// read.
const bulkRead = 16 << 10

// WriteTo implements io.WriterTo, so io.Copy out of a Conn (Pipe) writes
// the received frames' payloads to w as they are, without copying them
// through an intermediate buffer. It returns nil at the peer's half-close.
func (c *Conn) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		p, err := c.nextChunk()
		if err != nil || p == nil {
			return total, err
		}
		n, err := w.Write(p)
		total += int64(n)
		if err != nil {
			return total, err
		}
	}
}

// nextChunk waits for received bytes as Read does: nil, nil at the peer's
// half-close.
func (c *Conn) nextChunk() ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return nil, net.ErrClosed
		}
		if p := c.s.ReadChunk(c.s.cfg.MaxFrame); len(p) > 0 {
			c.flushLocked(time.Now())
			return p, nil
		}
		if c.s.PeerClosed() {
			return nil, nil
		}
		if err := c.s.Err(); err != nil {
			return nil, err
		}
		if !c.readDL.IsZero() && !time.Now().Before(c.readDL) {
			return nil, os.ErrDeadlineExceeded
		}
		c.cond.Wait()
	}
}
