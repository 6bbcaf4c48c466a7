package tunnelproto

import "sync"

// chunks is a byte queue kept as a list of slices, so that appending and
// consuming never copy what is already queued (a flat slice re-grows and
// moves its whole content as it is consumed from the front and appended
// at the back).
type chunks struct {
	bufs [][]byte
	// owners[i], when not nil, is the pooled buffer bufs[i] lies in: the
	// queue holds a reference to it until bufs[i] is consumed.
	owners []*frameBuf
	n      int
	// tailEnd is where the last chunk ends in its owner's buffer, when
	// it has one: pushRange extends it with the bytes read right after.
	tailEnd int
}

// frameBuf is a bulk stream's read buffer lent to a session's send
// queue (Conn.ReadFrom). The queue and every frame cut from it hold a
// reference; once the last is dropped (the frame acknowledged, the
// queue consumed past it) it goes back to readBufs for the next read,
// instead of a new MaxFrame allocation per read. References are counted
// under the Conn's lock, as the Session is only used under it. A failed
// session drops its queue and frames without counting: their buffers go
// to the collector.
//
// A frame given to the transport is encoded at once (publishFrame), so
// after its ack nothing reads its payload but a route's republish of its
// last frame on a path switch, which the peer drops as a duplicate
// without looking at the payload (it acknowledged that sequence).
type frameBuf struct {
	b    []byte
	refs int
}

var readBufs sync.Pool

// getFrameBuf returns a buffer of size bytes, recycled when one is free.
func getFrameBuf(size int) *frameBuf {
	if fb, _ := readBufs.Get().(*frameBuf); fb != nil && cap(fb.b) >= size {
		fb.b, fb.refs = fb.b[:size], 0
		return fb
	}
	return &frameBuf{b: make([]byte, size)}
}

// putFrameBuf recycles a buffer nobody refers to.
func putFrameBuf(fb *frameBuf) { readBufs.Put(fb) }

func (fb *frameBuf) ref() { fb.refs++ }

func (fb *frameBuf) unref() {
	if fb.refs--; fb.refs == 0 {
		putFrameBuf(fb)
	}
}

func (q *chunks) len() int { return q.n }

// push copies p in, filling the last chunk's spare capacity first; a new
// chunk gets capacity size (at least len(p)'s remainder).
func (q *chunks) push(p []byte, size int) {
	q.n += len(p)
	if k := len(q.bufs); k > 0 {
		last := q.bufs[k-1]
		c := min(cap(last)-len(last), len(p))
		q.bufs[k-1] = append(last, p[:c]...)
		p = p[c:]
	}
	if len(p) > 0 {
		b := make([]byte, len(p), max(size, len(p)))
		copy(b, p)
		q.bufs = append(q.bufs, b)
		q.owners = append(q.owners, nil)
	}
}

// pushOwned queues p itself, a received payload nobody writes to again
// (its capacity must end where it does, so that push never appends into
// it).
func (q *chunks) pushOwned(p []byte) {
	if len(p) == 0 {
		return
	}
	q.n += len(p)
	q.bufs = append(q.bufs, p)
	q.owners = append(q.owners, nil)
}

// pushRange queues own.b[start:end] itself, with a reference to own. When
// the last chunk ends at start in the same buffer (the read before this
// one), it grows instead: the reads of a bulk stream from a TLS
// connection (one record, at most 16 KiB, each) leave as one frame.
func (q *chunks) pushRange(own *frameBuf, start, end int) {
	if end <= start {
		return
	}
	q.n += end - start
	if k := len(q.bufs); k > 0 && q.owners[k-1] == own && q.tailEnd == start {
		from := start - len(q.bufs[k-1])
		q.bufs[k-1] = own.b[from:end:end]
		q.tailEnd = end
		return
	}
	own.ref()
	q.bufs = append(q.bufs, own.b[start:end:end])
	q.owners = append(q.owners, own)
	q.tailEnd = end
}

// take removes and returns up to n bytes from the front, never more
// than the first chunk holds: a slice of it, capped so that nobody appends
// to it. A frame ends where a chunk ends rather than copying two chunks
// together (a bulk stream's chunks are whole reads; a frame cut short by
// the window leaves the rest of its chunk for the next frame): the copy
// and its allocation cost more than a shorter frame.
// The pooled buffer it lies in, if any, is returned with a reference for
// the caller to drop.
func (q *chunks) take(n int) ([]byte, *frameBuf) {
	k := min(n, q.n)
	if k <= 0 {
		return nil, nil
	}
	head, own := q.bufs[0], q.owners[0]
	if own != nil {
		own.ref()
	}
	k = min(k, len(head))
	q.advance(k)
	return head[:k:k], own
}

// read copies the front into p and removes it.
func (q *chunks) read(p []byte) int {
	done := 0
	for done < len(p) && q.n > 0 {
		c := copy(p[done:], q.bufs[0])
		done += c
		q.advance(c)
	}
	return done
}

func (q *chunks) advance(k int) {
	q.n -= k
	if rest := q.bufs[0][k:]; len(rest) > 0 {
		q.bufs[0] = rest
		return
	}
	q.bufs[0] = nil
	q.bufs = q.bufs[1:]
	if own := q.owners[0]; own != nil {
		q.owners[0] = nil
		own.unref()
	}
	q.owners = q.owners[1:]
	if len(q.bufs) == 0 {
		q.bufs, q.owners = nil, nil
	}
}

// reset drops everything queued; pooled buffers go to the collector.
func (q *chunks) reset() { q.bufs, q.owners, q.n = nil, nil, 0 }
