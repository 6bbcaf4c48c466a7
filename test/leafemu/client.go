package leafemu

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

// client is one in-process connection to the emulated server: the NATS
// client protocol (INFO, CONNECT, PING/PONG, SUB, UNSUB, PUB, HPUB; MSG
// and HMSG back), its subscriptions and publishes carried by the link.
//
// What it writes to the client is queued and written by a goroutine of
// its own, without bound: the pipe holds no bytes, and nats.go flushes
// while holding the lock its reader needs, so a write of the emulated
// server that waited for the client's reader (a message, a PONG) while
// the client waited for the emulated server to read its flush would never
// end.
type client struct {
	l    *Link
	conn net.Conn

	qmu  sync.Mutex
	q    []byte
	wake chan struct{}
	done chan struct{}
}

// info is what the emulated server tells its clients.
const info = `INFO {"server_id":"leafemu","server_name":"leafemu","version":"2.15.2","proto":1,"headers":true,"max_payload":1048576}` + "\r\n"

func (c *client) serve() {
	defer c.close()
	go c.writeLoop()
	c.send(info)
	r := bufio.NewReaderSize(c.conn, 16<<10)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		op, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(op) {
		case "CONNECT":
		case "PING":
			c.send("PONG\r\n")
		case "PONG":
		case "SUB":
			// SUB subject [queue] sid
			f := strings.Fields(arg)
			switch len(f) {
			case 2:
				c.l.subscribe(c, &sub{subject: f[0], sid: f[1]})
			case 3:
				c.l.subscribe(c, &sub{subject: f[0], queue: f[1], sid: f[2]})
			default:
				c.send("-ERR 'Unknown Protocol Operation'\r\n")
				return
			}
		case "UNSUB":
			f := strings.Fields(arg)
			if len(f) == 0 {
				return
			}
			after := 0
			if len(f) > 1 {
				after, _ = strconv.Atoi(f[1])
			}
			c.l.unsubscribe(c, f[0], after)
		case "PUB", "HPUB":
			if err := c.publish(r, op == "HPUB", arg); err != nil {
				c.send(fmt.Sprintf("-ERR '%s'\r\n", err))
				return
			}
		}
	}
}

// publish reads one message of the client and sends it to the hub (when
// the hub has interest in its subject) and to the link's matching
// subscriptions: "subject [reply] [hdr] size".
func (c *client) publish(r *bufio.Reader, headers bool, arg string) error {
	f := strings.Fields(arg)
	n := 2
	if headers {
		n = 3
	}
	if len(f) < n || len(f) > n+1 {
		return fmt.Errorf("bad publish %q", arg)
	}
	subject, reply := f[0], ""
	if len(f) == n+1 {
		reply = f[1]
	}
	size, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return fmt.Errorf("bad publish size %q", arg)
	}
	hdr := 0
	if headers {
		if hdr, err = strconv.Atoi(f[len(f)-2]); err != nil {
			return fmt.Errorf("bad publish header size %q", arg)
		}
	}
	payload := make([]byte, size+2)
	if _, err := io.ReadFull(r, payload); err != nil {
		return err
	}
	payload = payload[:size]
	sent := c.l.hubWants(subject)
	if sent {
		c.l.writeMsg(subject, reply, hdr, payload)
	}
	if !c.l.deliver(subject, reply, hdr, payload, nil) && !sent && reply != "" {
		// No one to answer: a server tells the requester at once.
		c.l.deliver(reply, "", len(noResponders), []byte(noResponders), nil)
	}
	return nil
}

// noResponders is the status a server answers a request nobody
// subscribes to with.
const noResponders = "NATS/1.0 503\r\n\r\n"

// msg delivers one message to the client: MSG, or HMSG with headers.
func (c *client) msg(subject, sid, reply string, hdr int, payload []byte) {
	var b []byte
	if hdr > 0 {
		b = append(b, "HMSG "...)
	} else {
		b = append(b, "MSG "...)
	}
	b = append(append(b, subject...), ' ')
	b = append(append(b, sid...), ' ')
	if reply != "" {
		b = append(append(b, reply...), ' ')
	}
	if hdr > 0 {
		b = append(strconv.AppendInt(b, int64(hdr), 10), ' ')
	}
	b = append(strconv.AppendInt(b, int64(len(payload)), 10), "\r\n"...)
	b = append(append(b, payload...), "\r\n"...)
	c.enqueue(b)
}

func (c *client) send(s string) { c.enqueue([]byte(s)) }

func (c *client) enqueue(b []byte) {
	c.qmu.Lock()
	c.q = append(c.q, b...)
	c.qmu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// writeLoop writes what is queued for the client until it closes.
func (c *client) writeLoop() {
	var buf []byte
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		c.qmu.Lock()
		buf, c.q = c.q, buf[:0]
		c.qmu.Unlock()
		if _, err := c.conn.Write(buf); err != nil {
			_ = c.conn.Close()
			return
		}
	}
}

// close drops the client's subscriptions from the link.
func (c *client) close() {
	close(c.done)
	_ = c.conn.Close()
	l := c.l
	l.mu.Lock()
	subs := l.subs[c]
	delete(l.subs, c)
	delete(l.clients, c)
	var gone []string
	for _, s := range subs {
		if key := l.unsentLocked(s); key != "" {
			gone = append(gone, key)
		}
	}
	l.mu.Unlock()
	if l.closed.Load() {
		return
	}
	for _, key := range gone {
		l.write("LS- ", key, "\r\n")
	}
}
