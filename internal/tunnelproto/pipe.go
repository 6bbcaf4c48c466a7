package tunnelproto

import (
	"io"
	"net"
	"sync"
)

type closeWriter interface{ CloseWrite() error }

// Pipe relays a and b both ways until both directions ended, passing each
// end-of-stream on as a half-close, then closes both. A broken stream (a
// read or write error either way: a session lost or aborted, a
// connection reset) breaks both ends, so that neither side takes a cut
// stream for a complete one: a session is aborted with the cause, a TCP
// connection is reset (RST, not FIN). It returns the bytes copied a→b
// and b→a.
func Pipe(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		var err error
		*n, err = io.Copy(dst, src)
		if err != nil {
			Break(dst, err)
			Break(src, err)
			return
		}
		if cw, ok := dst.(closeWriter); ok {
			_ = cw.CloseWrite()
			return
		}
		// No half-close: end both directions.
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Add(2)
	go half(b, a, &ab)
	go half(a, b, &ba)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
	return ab, ba
}

// Break ends c as broken by cause: a session (*Conn) is aborted, telling
// the peer cause; a TCP connection, or one wrapping it (NetConn, as
// *tls.Conn), is reset; anything else is closed.
func Break(c net.Conn, cause error) {
	for {
		switch x := c.(type) {
		case *Conn:
			x.Abort(cause.Error())
			return
		case *net.TCPConn:
			_ = x.SetLinger(0)
			_ = x.Close()
			return
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			_ = c.Close()
			return
		}
	}
}
