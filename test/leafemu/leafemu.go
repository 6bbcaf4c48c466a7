// Package leafemu emulates an edge node's NATS server for fleet
// benchmarks: one real leaf connection to the hub per node (the leafnode
// protocol, the node's own credentials signing the hub's nonce, TLS when
// given), without a whole nats-server per node. A node's programs reach
// the hub through it over an in-process nats.Conn (Link.Connect), as they
// reach it through their node's server in production: what they
// subscribe to becomes the leaf link's interest (LS+), what they publish
// goes to the hub when the hub has interest in it, and what the hub sends
// reaches their subscriptions. With Options.Reconnect a lost link dials
// the hub again, as a node's server does, its programs staying connected
// meanwhile; each new connection sends the node's interest again and has
// a new Gen.
//
// What it leaves out, by design: routes (a unit's mesh), JetStream on the
// node, accounts other than the credentials' own, and the loop detection
// a server does between leafs. It is a harness for the hub's side of a
// fleet; the production edge server is edge/natsnode.
package leafemu

import (
	"bufio"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Options are one emulated node's leaf link.
type Options struct {
	// URL is the hub's leaf URL (nats-leaf://host:port, or tls://).
	URL string
	// TLS, when set, makes the link TLS (after the hub's INFO, as a
	// leaf remote does); the hub must then require it.
	TLS *tls.Config
	// Name is the node's server name, as the hub shows it.
	Name string
	// JWT and Seed are the node's user credentials: the JWT is sent, the
	// seed signs the hub's nonce.
	JWT  string
	Seed []byte
	// Ping is how often the link pings the hub when quiet; 0: every 4 s,
	// as atoll-edge's server does.
	Ping time.Duration
	// Reconnect, when positive, dials the hub again that long after the
	// link is lost (and after each failed attempt), as a node's server
	// does (atoll-edge's every second): the node's clients stay
	// connected to it meanwhile, and its interest is sent again on the
	// new link. 0: a lost link closes the node.
	Reconnect time.Duration
	// InfoTimeout and TLSTimeout bound, as a node's leaf remote does,
	// the wait for the hub's INFO once connected and the TLS handshake;
	// a link that runs out starts over after Reconnect. 0: nats-server's
	// defaults, 1 s and 2 s (atoll-edge's are edge/natsnode's
	// HubInfoTimeout and HubTLSTimeout).
	InfoTimeout, TLSTimeout time.Duration
}

// Link is one emulated node's leaf connection to the hub and the
// in-process clients using it.
type Link struct {
	opts Options

	wmu  sync.Mutex // guards the current connection and the writes to it
	conn net.Conn
	w    *bufio.Writer

	mu       sync.Mutex
	interest map[string]int // the hub's interest: "subject" or "subject queue" → LS+ count
	subs     map[*client]map[string]*sub
	sent     map[string]int // our LS+ keys → references
	clients  map[*client]bool
	err      error

	done   chan struct{}
	closed atomic.Bool

	// gen numbers the link's connections (1 the first): 0 while the
	// link is down.
	gen, last atomic.Uint64

	// In and Out count messages the hub sent this link and it sent the
	// hub; Reconnects the connections after the first.
	In, Out, Reconnects atomic.Int64
}

type sub struct {
	subject, queue, sid string
	max, got            int
}

// Dial opens the leaf link: the hub's INFO, TLS if configured, CONNECT
// with the signed nonce; it returns once the hub answered a PING, so the
// credentials were accepted.
func Dial(ctx context.Context, o Options) (*Link, error) {
	if _, err := url.Parse(o.URL); err != nil {
		return nil, fmt.Errorf("leafemu: hub URL %q: %w", o.URL, err)
	}
	l := &Link{opts: o, interest: map[string]int{},
		subs: map[*client]map[string]*sub{}, sent: map[string]int{}, clients: map[*client]bool{}, done: make(chan struct{})}
	r, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	go l.readLoop(r)
	go l.pingLoop()
	return l, nil
}

// connect dials the hub, links, sends the node's interest and makes the
// connection the link's current one. It returns the connection's reader.
func (l *Link) connect(ctx context.Context) (*bufio.Reader, error) {
	u, _ := url.Parse(l.opts.URL)
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, fmt.Errorf("leafemu: %w %s: %w", errDial, u.Host, err)
	}
	dl, _ := ctx.Deadline()
	conn, r, w, err := l.handshake(conn, dl)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("leafemu: %s: %w", l.opts.Name, err)
	}
	_ = conn.SetDeadline(time.Time{})
	// The node's interest, then the connection is the current one: a
	// client's subscription recorded after this snapshot is written to
	// the new connection (it waits for wmu).
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.mu.Lock()
	keys := make([]string, 0, len(l.sent))
	for k := range l.sent {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	for _, k := range keys {
		_, _ = w.WriteString(lsPlus(k))
	}
	if err := w.Flush(); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("leafemu: %s: send interest: %w", l.opts.Name, err)
	}
	l.conn, l.w = conn, w
	l.gen.Store(l.last.Add(1))
	return r, nil
}

// handshake links conn: the hub's INFO, TLS if configured, CONNECT with
// the signed nonce, until the hub's PONG (its interest recorded on the
// way), all before dl (none if zero).
func (l *Link) handshake(conn net.Conn, dl time.Time) (net.Conn, *bufio.Reader, *bufio.Writer, error) {
	// within sets conn's deadline to d from now, or dl if sooner.
	within := func(d time.Duration) {
		at := time.Now().Add(d)
		if !dl.IsZero() && dl.Before(at) {
			at = dl
		}
		_ = conn.SetDeadline(at)
	}
	r := bufio.NewReaderSize(conn, 32<<10)
	within(cmp.Or(l.opts.InfoTimeout, time.Second))
	line, err := r.ReadString('\n')
	if err != nil {
		return conn, nil, nil, fmt.Errorf("read INFO: %w", err)
	}
	op, arg, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
	if op != "INFO" {
		return conn, nil, nil, fmt.Errorf("want INFO from the hub, got %q", line)
	}
	var info server.Info
	if err := json.Unmarshal([]byte(arg), &info); err != nil {
		return conn, nil, nil, fmt.Errorf("hub INFO: %w", err)
	}
	if info.TLSRequired != (l.opts.TLS != nil) {
		return conn, nil, nil, fmt.Errorf("hub requires TLS %v, link has TLS %v", info.TLSRequired, l.opts.TLS != nil)
	}
	if l.opts.TLS != nil {
		tc := tls.Client(conn, l.opts.TLS)
		within(cmp.Or(l.opts.TLSTimeout, 2*time.Second))
		if err := tc.Handshake(); err != nil {
			return conn, nil, nil, fmt.Errorf("TLS: %w", err)
		}
		conn, r = tc, bufio.NewReaderSize(tc, 32<<10)
	}
	// Then only dl: the hub's authentication timeout ends a link that
	// waits too long for its PONG.
	_ = conn.SetDeadline(dl)
	w := bufio.NewWriterSize(conn, 4<<10)
	kp, err := nkeys.FromSeed(l.opts.Seed)
	if err != nil {
		return conn, nil, nil, fmt.Errorf("seed: %w", err)
	}
	sig, err := kp.Sign([]byte(info.Nonce))
	if err != nil {
		return conn, nil, nil, fmt.Errorf("sign nonce: %w", err)
	}
	connect, err := json.Marshal(map[string]any{
		"jwt": l.opts.JWT, "sig": base64.RawURLEncoding.EncodeToString(sig),
		"name": l.opts.Name, "server_id": l.opts.Name, "headers": true,
		"compress_mode": "off", "protocol": 1,
		// As atoll-edge's server asks (natsnode's RequestIsolation): no
		// other leaf's interest.
		"isolate": true,
	})
	if err != nil {
		return conn, nil, nil, err
	}
	if _, err := fmt.Fprintf(w, "CONNECT %s\r\nPING\r\n", connect); err != nil {
		return conn, nil, nil, err
	}
	if err := w.Flush(); err != nil {
		return conn, nil, nil, err
	}
	// Until the PONG: the hub's interest, INFO updates, or its refusal.
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return conn, nil, nil, fmt.Errorf("after CONNECT: %w", err)
		}
		line = strings.TrimRight(line, "\r\n")
		switch op, arg, _ := strings.Cut(line, " "); op {
		case "PONG":
			return conn, r, w, nil
		case "PING":
			_, _ = w.WriteString("PONG\r\n")
			if err := w.Flush(); err != nil {
				return conn, nil, nil, err
			}
		case "-ERR":
			return conn, nil, nil, fmt.Errorf("hub refused the link: %s", arg)
		case "LS+", "LS-":
			l.leafSub(op == "LS+", arg)
		}
	}
}

// errDial marks a connection that failed before the hub accepted it.
var errDial = errors.New("dial")

// Gen numbers the link's current connection to the hub (1 the first,
// one more each reconnect); 0 while the link is down.
func (l *Link) Gen() uint64 { return l.gen.Load() }

// Err is why the link closed (nil while open).
func (l *Link) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Done is closed when the link closes.
func (l *Link) Done() <-chan struct{} { return l.done }

// Close closes the link and its clients.
func (l *Link) Close() error {
	l.fail(errors.New("closed"))
	return nil
}

// relinkTimeout bounds one attempt to link again: beyond the hub's own
// bounds (INFO, TLS, authentication), it only ends an attempt that hangs.
const relinkTimeout = 2 * time.Minute

// lost handles the loss of the connection r reads: without Reconnect
// the link closes; with it the link is down (no interest of the hub's, so
// nothing is sent) until a new connection is made.
func (l *Link) lost(err error) {
	if l.opts.Reconnect <= 0 || l.closed.Load() {
		l.fail(err)
		return
	}
	l.wmu.Lock()
	_ = l.conn.Close()
	l.gen.Store(0)
	l.wmu.Unlock()
	l.mu.Lock()
	clear(l.interest)
	l.mu.Unlock()
	// As a node's server's leaf remote: the interval after a lost
	// connection (and after one the hub closed while linking), the
	// interval plus up to as much again at random after a failed dial.
	wait := l.opts.Reconnect
	for {
		select {
		case <-l.done:
			return
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(context.Background(), relinkTimeout)
		r, err := l.connect(ctx)
		cancel()
		wait = l.opts.Reconnect
		if errors.Is(err, errDial) {
			wait += rand.N(l.opts.Reconnect)
		}
		if err == nil {
			l.Reconnects.Add(1)
			if l.closed.Load() {
				l.wmu.Lock()
				_ = l.conn.Close()
				l.wmu.Unlock()
				return
			}
			go l.readLoop(r)
			return
		}
	}
}

func (l *Link) fail(err error) {
	if !l.closed.CompareAndSwap(false, true) {
		return
	}
	l.mu.Lock()
	l.err = err
	clients := l.clients
	l.clients = map[*client]bool{}
	l.mu.Unlock()
	l.wmu.Lock()
	_ = l.conn.Close()
	l.gen.Store(0)
	l.wmu.Unlock()
	for c := range clients {
		_ = c.conn.Close()
	}
	close(l.done)
}

// write sends protocol to the hub.
func (l *Link) write(parts ...string) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	for _, p := range parts {
		_, _ = l.w.WriteString(p)
	}
	if err := l.w.Flush(); err != nil {
		// Its reader sees the loss and handles it.
		_ = l.conn.Close()
	}
}

// writeMsg sends one message to the hub: LMSG, or HMSG with headers.
func (l *Link) writeMsg(subject, reply string, hdr int, payload []byte) {
	var b strings.Builder
	if hdr > 0 {
		b.WriteString("HMSG ")
	} else {
		b.WriteString("LMSG ")
	}
	b.WriteString(subject)
	b.WriteByte(' ')
	if reply != "" {
		b.WriteString(reply)
		b.WriteByte(' ')
	}
	if hdr > 0 {
		b.WriteString(strconv.Itoa(hdr))
		b.WriteByte(' ')
	}
	b.WriteString(strconv.Itoa(len(payload)))
	b.WriteString("\r\n")
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, _ = l.w.WriteString(b.String())
	_, _ = l.w.Write(payload)
	_, _ = l.w.WriteString("\r\n")
	if err := l.w.Flush(); err != nil {
		_ = l.conn.Close()
		return
	}
	l.Out.Add(1)
}

func (l *Link) pingLoop() {
	every := l.opts.Ping
	if every <= 0 {
		every = 4 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case <-t.C:
			l.write("PING\r\n")
		}
	}
}

// readLoop reads one connection (r) until it ends.
func (l *Link) readLoop(r *bufio.Reader) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			l.lost(fmt.Errorf("read: %w", err))
			return
		}
		line = strings.TrimRight(line, "\r\n")
		op, arg, _ := strings.Cut(line, " ")
		switch op {
		case "PING":
			l.write("PONG\r\n")
		case "LS+", "LS-":
			l.leafSub(op == "LS+", arg)
		case "LMSG", "HMSG":
			if err := l.leafMsg(r, op == "HMSG", arg); err != nil {
				l.lost(err)
				return
			}
		case "-ERR":
			l.lost(fmt.Errorf("hub: %s", arg))
			return
		}
	}
}

// leafSub records the hub's interest: "subject" or "subject queue weight".
func (l *Link) leafSub(add bool, arg string) {
	f := strings.Fields(arg)
	if len(f) == 0 {
		return
	}
	key := f[0]
	if len(f) >= 2 {
		key += " " + f[1]
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if add {
		l.interest[key]++
	} else {
		delete(l.interest, key)
	}
}

// hubWants reports whether the hub has interest in subject.
func (l *Link) hubWants(subject string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.interest {
		filter, _, _ := strings.Cut(key, " ")
		if filter == subject || server.SubjectMatchesFilter(subject, filter) {
			return true
		}
	}
	return false
}

// leafMsg reads one message from the hub and delivers it to the
// subscriptions it matches: "subject [+ reply queues... | | queues... |
// reply] [hdr] size".
func (l *Link) leafMsg(r *bufio.Reader, headers bool, arg string) error {
	f := strings.Fields(arg)
	if len(f) < 2 {
		return fmt.Errorf("bad message from the hub: %q", arg)
	}
	subject, reply := f[0], ""
	var queues []string
	sizes := f[len(f)-1:]
	if headers {
		if len(f) < 3 {
			return fmt.Errorf("bad message from the hub: %q", arg)
		}
		sizes = f[len(f)-2:]
	}
	mid := f[1 : len(f)-len(sizes)]
	switch {
	case len(mid) > 0 && mid[0] == "+":
		reply, queues = mid[1], mid[2:]
	case len(mid) > 0 && mid[0] == "|":
		queues = mid[1:]
	case len(mid) == 1:
		reply = mid[0]
	}
	size, err := strconv.Atoi(sizes[len(sizes)-1])
	if err != nil {
		return fmt.Errorf("bad size from the hub: %q", arg)
	}
	hdr := 0
	if headers {
		if hdr, err = strconv.Atoi(sizes[0]); err != nil {
			return fmt.Errorf("bad header size from the hub: %q", arg)
		}
	}
	payload := make([]byte, size+2)
	if _, err := io.ReadFull(r, payload); err != nil {
		return fmt.Errorf("read message: %w", err)
	}
	l.In.Add(1)
	// A JetStream delivery carries the stream subject after its ack
	// reply ("$JS.ACK.<8 tokens>@<subject>"): matched on the delivery
	// subject, it reaches the client under the stream subject, as a
	// server delivers it.
	as := subject
	if i := jsAckSubject(reply); i >= 0 {
		as, reply = reply[i+1:], reply[:i]
	}
	l.deliverAs(subject, as, reply, hdr, payload[:size], queues)
	return nil
}

// jsAckSubject returns the index of the "@" that ends a JetStream ack
// reply carrying its message's subject, or -1.
func jsAckSubject(reply string) int {
	if !strings.HasPrefix(reply, "$JS.ACK.") {
		return -1
	}
	dots := 0
	for i := 0; i < len(reply); i++ {
		switch reply[i] {
		case '.':
			dots++
		case '@':
			if dots >= 8 && i < len(reply)-1 {
				return i
			}
		}
	}
	return -1
}

// deliver hands a message to the in-process subscriptions it matches
// (the publishing client's own included): every plain subscription, and
// one member of each queue group (of queues only, when the hub named
// them). It reports whether any took it.
func (l *Link) deliver(subject, reply string, hdr int, payload []byte, queues []string) bool {
	return l.deliverAs(subject, subject, reply, hdr, payload, queues)
}

// deliverAs is deliver of a message matched on subject and handed over
// as the subject as.
func (l *Link) deliverAs(subject, as, reply string, hdr int, payload []byte, queues []string) bool {
	type target struct {
		c *client
		s *sub
	}
	var out []target
	groups := map[string]bool{}
	l.mu.Lock()
	for c, subs := range l.subs {
		for _, s := range subs {
			if s.subject != subject && !server.SubjectMatchesFilter(subject, s.subject) {
				continue
			}
			if s.queue != "" {
				if groups[s.queue] || (len(queues) > 0 && !contains(queues, s.queue)) {
					continue
				}
				groups[s.queue] = true
			}
			s.got++
			if s.max > 0 && s.got >= s.max {
				delete(subs, s.sid)
				l.unsentLocked(s)
			}
			out = append(out, target{c, s})
		}
	}
	l.mu.Unlock()
	for _, t := range out {
		t.c.msg(as, t.s.sid, reply, hdr, payload)
	}
	return len(out) > 0
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// subscribe records a client's subscription and, for a new subject (and
// queue), tells the hub.
func (l *Link) subscribe(c *client, s *sub) {
	key := s.subject
	if s.queue != "" {
		key += " " + s.queue
	}
	l.mu.Lock()
	if l.subs[c] == nil {
		l.subs[c] = map[string]*sub{}
	}
	l.subs[c][s.sid] = s
	l.sent[key]++
	first := l.sent[key] == 1
	l.mu.Unlock()
	if !first {
		return
	}
	l.write(lsPlus(key))
}

// lsPlus is the LS+ of an interest key: "subject", or "subject queue"
// with the queue's weight.
func lsPlus(key string) string {
	if strings.Contains(key, " ") {
		return "LS+ " + key + " 1\r\n"
	}
	return "LS+ " + key + "\r\n"
}

// unsubscribe drops a client's subscription (after > 0: once it has had
// that many messages in all).
func (l *Link) unsubscribe(c *client, sid string, after int) {
	l.mu.Lock()
	s := l.subs[c][sid]
	if s == nil {
		l.mu.Unlock()
		return
	}
	if after > 0 && s.got < after {
		s.max = after
		l.mu.Unlock()
		return
	}
	delete(l.subs[c], sid)
	key := l.unsentLocked(s)
	l.mu.Unlock()
	if key != "" {
		l.write("LS- ", key, "\r\n")
	}
}

// unsentLocked drops one reference to s's interest; it returns the key
// to withdraw from the hub when none is left (the caller writes LS-
// outside the lock; deliver leaves it to the next subscription change:
// the hub's copy of a stale interest only costs it a message).
func (l *Link) unsentLocked(s *sub) string {
	key := s.subject
	if s.queue != "" {
		key += " " + s.queue
	}
	if l.sent[key]--; l.sent[key] > 0 {
		return ""
	}
	delete(l.sent, key)
	return key
}

// Connect returns a nats.Conn of the node's programs over this link (as
// they would connect to their node's server), with opts after the
// emulator's own.
func (l *Link) Connect(opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.InProcessServer(l), nats.Name(l.opts.Name), nats.NoReconnect()}, opts...)
	return nats.Connect("", opts...)
}

// InProcessConn implements nats.InProcessConnProvider: one client of the
// link's emulated server, speaking the client protocol over a pipe.
func (l *Link) InProcessConn() (net.Conn, error) {
	if l.closed.Load() {
		return nil, errors.New("leafemu: link closed")
	}
	ours, theirs := net.Pipe()
	c := &client{l: l, conn: ours, wake: make(chan struct{}, 1), done: make(chan struct{})}
	l.mu.Lock()
	l.clients[c] = true
	l.mu.Unlock()
	go c.serve()
	return theirs, nil
}

// Interest is the hub's interest on the link: each subject (and queue)
// the hub told it of.
func (l *Link) Interest() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.interest))
	for k := range l.interest {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
