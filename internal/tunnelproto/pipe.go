package tunnelproto

import (
	"io"
	"net"
	"sync"
)

type closeWriter interface{ CloseWrite() error }

// Pipe relays a and b both ways until both directions ended, passing each
// end-of-stream on as a half-close, then closes both. It returns the bytes
// copied a→b and b→a.
func Pipe(a, b net.Conn) (ab, ba int64) {
	var wg sync.WaitGroup
	half := func(dst, src net.Conn, n *int64) {
		defer wg.Done()
		var err error
		*n, err = io.Copy(dst, src)
		if cw, ok := dst.(closeWriter); ok && err == nil {
			_ = cw.CloseWrite()
			return
		}
		// An error, or no half-close: end both directions.
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
