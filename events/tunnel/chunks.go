package tunnel

// chunks is a byte queue kept as a list of slices, so that appending and
// consuming never copy what is already queued (a flat slice re-grows and
// moves its whole content as it is consumed from the front and appended
// at the back, which dominated the tunnel's CPU profile).
type chunks struct {
	bufs [][]byte
	n    int
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
	}
}

// pushOwned queues p itself (the caller gives it up).
func (q *chunks) pushOwned(p []byte) {
	if len(p) == 0 {
		return
	}
	q.n += len(p)
	q.bufs = append(q.bufs, p)
}

// take removes and returns up to max bytes from the front, never more
// than the first chunk holds: a slice of it, capped so that nobody appends
// to it. A frame ends where a chunk ends rather than copying two chunks
// together (a bulk stream's chunks are whole reads; a frame cut short by
// the window leaves the rest of its chunk for the next frame): the copy
// and its allocation cost more than a shorter frame.
func (q *chunks) take(max int) []byte {
	k := min(max, q.n)
	if k <= 0 {
		return nil
	}
	head := q.bufs[0]
	k = min(k, len(head))
	q.advance(k)
	return head[:k:k]
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
	if len(q.bufs) == 0 {
		q.bufs = nil
	}
}

func (q *chunks) reset() { q.bufs, q.n = nil, 0 }
