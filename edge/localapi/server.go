// Package localapi is the node's local API endpoint: the Kubernetes API
// on a loopback address for the node's own components (the kubelet,
// kube-proxy, hostNetwork daemons), so that they start and run while
// kube-apiserver cannot be reached.
//
// While kube-apiserver answers, requests pass to it with the node's own
// client credentials (the kubelet's), so the Node authorizer and
// NodeRestriction decide what the node may do; every read, list and
// watch a component makes is kept, per component (by User-Agent), in
// memory and on disk. While it does not (its /readyz probe or a request
// fails, or a read the cache can answer is slow), reads are answered
// from what that component read before: objects, lists at the resource
// version they were current at, watches that deliver a list's initial
// events when asked for them and then stay open, quiet, until
// kube-apiserver is back (then they end, and the component watches
// kube-apiserver again). The service-account token last issued for a
// request is answered again while it is valid. Writes are answered 503
// ServiceUnavailable, never kept or faked: the components' own retries
// deliver them once the link is back. Nothing is served that the node
// did not read itself, and only on loopback.
package localapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Verbs, as the metrics count them.
const (
	verbRead  = "read"
	verbWatch = "watch"
	verbToken = "token"
	verbWrite = "write"
)

// initialEventsEnd marks the bookmark that ends a watch's initial events.
const initialEventsEnd = "k8s.io/initial-events-end"

// maxTokenRequest bounds the body of a TokenRequest.
const maxTokenRequest = 1 << 20

// Server is the local API endpoint.
type Server struct {
	cfg    Config
	log    *slog.Logger
	cache  *Cache
	m      *metrics
	base   *url.URL
	client *http.Client
	// transport is client's, whose pooled connections go when
	// kube-apiserver's reachability changes; fresh probes while it is
	// unreachable, on a new connection each time.
	transport *http.Transport
	fresh     *http.Client
	writes    *httputil.ReverseProxy
	ln        net.Listener
	srv       *http.Server
	certs     clientCert

	mu      sync.Mutex
	online  bool
	since   time.Time
	back    chan struct{} // closed when kube-apiserver is reachable again
	closing chan struct{} // closed when the server stops
	probed  chan struct{} // closed once the first probe has answered
	once    sync.Once
}

// New loads the cache and listens on cfg.Listen; Run serves.
func New(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := newMetrics(reg)
	cache, err := OpenCache(cfg.Dir, cfg.Retain, log, m)
	if err != nil {
		return nil, err
	}
	base, _ := url.Parse(cfg.APIServer) // checked by Validate
	base.Path, base.RawQuery = "", ""
	s := &Server{cfg: cfg, log: log, cache: cache, m: m, base: base,
		certs: clientCert{certFile: cfg.CertFile, keyFile: cfg.KeyFile},
		since: time.Now(), back: make(chan struct{}), closing: make(chan struct{}), probed: make(chan struct{})}
	if _, err := s.certs.get(nil); err != nil {
		return nil, fmt.Errorf("local API: client credentials: %w", err)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12, GetClientCertificate: s.certs.get}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("local API: %w", err)
		}
		tlsConfig.RootCAs = x509.NewCertPool()
		if !tlsConfig.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("local API: %s holds no PEM certificate", cfg.CAFile)
		}
	}
	dialer := &net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if cfg.Via == ViaHub {
		// Every connection goes through atoll-edge, whatever the URL's
		// host: the TLS handshake still names and verifies that host.
		dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, cfg.HubForward)
		}
	}
	transport := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: cfg.Timeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		// A link that dies silently (a NAT forgets it) ends the
		// connection's watches within these, not at TCP's timeout.
		HTTP2: &http.HTTP2Config{SendPingTimeout: 2 * cfg.Timeout, PingTimeout: cfg.Timeout},
	}
	s.client, s.transport = &http.Client{Transport: transport}, transport
	// While kube-apiserver counts as unreachable, each probe dials anew: a
	// connection pooled from before a cut may be stalled (TCP backing off
	// its retransmissions, or its bytes lost), and reusing it would keep
	// the endpoint offline through a link that works again.
	fresh := transport.Clone()
	fresh.DisableKeepAlives = true
	s.fresh = &http.Client{Transport: fresh}
	s.writes = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(s.base)
			stripCredentials(pr.Out.Header)
		},
		Transport:     transport,
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return
			}
			s.unreachable(err)
			s.refuse(w, r, component(r), verbWrite, "the write was not sent; retry once kube-apiserver is reachable")
		},
	}
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("local API: %w", err)
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	m.online.Set(0)
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves, probes kube-apiserver and writes the cache until ctx is
// done, then stops: held watches end, open requests get a few seconds,
// and what changed is written.
func (s *Server) Run(ctx context.Context) error {
	serveErr := make(chan error, 1)
	go func() { serveErr <- s.srv.Serve(s.ln) }()
	s.probe(ctx)
	probe := time.NewTicker(s.cfg.ProbeInterval)
	defer probe.Stop()
	flush := time.NewTicker(s.cfg.FlushInterval)
	defer flush.Stop()
	for {
		select {
		case <-probe.C:
			s.probe(ctx)
		case <-flush.C:
			_ = s.cache.Flush() // logged by Flush; tried again
		case err := <-serveErr:
			return fmt.Errorf("local API: %w", err)
		case <-ctx.Done():
			close(s.closing)
			stop, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := s.srv.Shutdown(stop)
			if ferr := s.cache.Flush(); ferr != nil {
				err = errors.Join(err, ferr)
			}
			return err
		}
	}
}

// probe asks kube-apiserver's /readyz.
func (s *Server) probe(ctx context.Context) {
	defer s.once.Do(func() { close(s.probed) })
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base.JoinPath("/readyz").String(), nil)
	client := s.client
	if online, _, _ := s.state(); !online {
		client = s.fresh
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			s.unreachable(err)
		}
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		s.unreachable(fmt.Errorf("/readyz answered %s", resp.Status))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.online {
		return
	}
	s.log.Info("local API: kube-apiserver is reachable; requests pass to it", "apiserver", s.base.Host, "after", time.Since(s.since).Round(time.Millisecond))
	s.online, s.since = true, time.Now()
	// Requests go on new connections, not on one pooled before the cut.
	s.transport.CloseIdleConnections()
	close(s.back)
	s.m.online.Set(1)
	s.m.transitions.WithLabelValues("online").Inc()
}

// unreachable answers from the cache from now on, until a probe works.
func (s *Server) unreachable(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.online {
		return
	}
	s.log.Warn("local API: kube-apiserver is unreachable; reads are answered from the cache", "apiserver", s.base.Host, "err", err)
	s.online, s.since = false, time.Now()
	s.transport.CloseIdleConnections()
	s.back = make(chan struct{})
	s.m.online.Set(0)
	s.m.transitions.WithLabelValues("offline").Inc()
}

// state is whether kube-apiserver is reachable, and if not, since when
// and the channel closed when it is again.
func (s *Server) state() (online bool, since time.Time, back <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.online, s.since, s.back
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	comp, verb := component(r), classify(r)
	online, _, _ := s.state()
	// Until the first probe answers, what the cache holds is answered
	// from it (a node booting with the link down starts at once; online,
	// held watches end at the probe and go to kube-apiserver), and the
	// rest waits for the probe.
	if !s.wasProbed() && verb != verbToken { // token waits once it knows its key
		kept := (verb == verbRead || verb == verbWatch) && cacheableRead(r) && s.cache.Has(comp, keyOf(r))
		if !kept {
			if !s.waitProbe(r.Context()) {
				return
			}
			online, _, _ = s.state()
		}
	}
	switch {
	case verb == verbWrite && online:
		s.m.requests.WithLabelValues(comp, verb, "apiserver").Inc()
		s.writes.ServeHTTP(w, r)
	case verb == verbWrite:
		s.refuse(w, r, comp, verb, "the write was not sent; retry once kube-apiserver is reachable")
	case verb == verbToken:
		s.token(w, r, comp, online)
	case verb == verbWatch && online:
		s.watch(w, r, comp)
	case verb == verbWatch:
		s.holdWatch(w, r, comp)
	case online:
		s.read(w, r, comp)
	default:
		s.readCache(w, r, comp)
	}
}

// wasProbed reports whether the first probe has answered.
func (s *Server) wasProbed() bool {
	select {
	case <-s.probed:
		return true
	default:
		return false
	}
}

// waitProbe waits for the first probe's answer; false if ctx ends first.
func (s *Server) waitProbe(ctx context.Context) bool {
	select {
	case <-s.probed:
		return true
	case <-ctx.Done():
		return false
	}
}

// read passes a read to kube-apiserver and keeps its answer; one the
// cache can answer falls back to it when kube-apiserver is unreachable
// or slower than Timeout.
func (s *Server) read(w http.ResponseWriter, r *http.Request, comp string) {
	key := keyOf(r)
	ctx := r.Context()
	cacheable := cacheableRead(r)
	if cacheable && s.cache.Has(comp, key) {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	resp, err := s.do(ctx, r, nil, cacheable)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			s.unreachable(err)
		}
		s.readCache(w, r, comp)
		return
	}
	switch {
	case !cacheable:
	case resp.code == http.StatusOK && isJSON(resp.header):
		s.keep(comp, key, resp.body)
	case resp.code == http.StatusNotFound:
		s.cache.Forget(comp, key)
	}
	s.m.requests.WithLabelValues(comp, verbRead, "apiserver").Inc()
	resp.write(w)
}

// keep keeps a read's answer: a list whole, or one object.
func (s *Server) keep(comp, key string, body []byte) {
	var head struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(body, &head) != nil {
		return
	}
	if strings.HasSuffix(head.Kind, "List") {
		s.cache.PutList(comp, key, body)
		return
	}
	s.cache.PutObject(comp, key, body)
}

// readCache answers a read from the cache.
func (s *Server) readCache(w http.ResponseWriter, r *http.Request, comp string) {
	key := keyOf(r)
	if apiVersion, kind, rv, items, ok := s.cache.List(comp, key); ok && cacheableRead(r) {
		s.m.requests.WithLabelValues(comp, verbRead, "cache").Inc()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(listJSON(apiVersion, kind, rv, items))
		return
	}
	if body, ok := s.cache.Object(comp, key); ok && cacheableRead(r) {
		s.m.requests.WithLabelValues(comp, verbRead, "cache").Inc()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
		return
	}
	s.refuse(w, r, comp, verbRead, "the node's cache holds no answer to it")
}

func listJSON(apiVersion, kind, rv string, items []json.RawMessage) []byte {
	var b bytes.Buffer
	head, _ := json.Marshal(map[string]any{"kind": kind, "apiVersion": apiVersion, "metadata": map[string]string{"resourceVersion": rv}})
	b.Write(head[:len(head)-1])
	b.WriteString(`,"items":[`)
	for i, it := range items {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// watch passes a watch to kube-apiserver and applies its events to the
// component's list of the same collection.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, comp string) {
	key := keyOf(r)
	resp, err := s.open(r.Context(), r, nil, true)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		s.unreachable(err)
		s.holdWatch(w, r, comp)
		return
	}
	defer resp.Body.Close()
	s.m.requests.WithLabelValues(comp, verbWatch, "apiserver").Inc()
	copyHeader(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	if resp.StatusCode != http.StatusOK || !isJSON(resp.Header) {
		_, _ = io.Copy(w, resp.Body)
		return
	}
	// A watch that starts with the collection's state (sendInitialEvents)
	// replaces the kept list once its initial events end.
	var initial map[string]json.RawMessage
	if r.URL.Query().Get("sendInitialEvents") == "true" {
		initial = map[string]json.RawMessage{}
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev Event
		if err := dec.Decode(&ev); err != nil {
			return // the client watches again: through kube-apiserver or from the cache
		}
		line, _ := json.Marshal(ev)
		if _, err := w.Write(append(line, '\n')); err != nil {
			return
		}
		if flusher != nil {
			flusher.Flush()
		}
		if initial == nil {
			s.cache.Apply(comp, key, ev)
			continue
		}
		var m meta
		if json.Unmarshal(ev.Object, &m) != nil {
			continue
		}
		switch {
		case ev.Type == "ADDED":
			initial[m.key()] = bytes.Clone(ev.Object)
		case ev.Type == "BOOKMARK" && m.Metadata.Annotations[initialEventsEnd] == "true":
			s.cache.ReplaceList(comp, key, m.APIVersion, m.Kind+"List", m.Metadata.ResourceVersion, initial)
			initial = nil
		}
	}
}

// holdWatch answers a watch from the cache: the list's initial events
// when asked for, then nothing until kube-apiserver is reachable again,
// the watch's timeout, or the client leaves. A watch from a resource
// version older than the kept list's is answered 410 Gone, as
// kube-apiserver answers one it no longer has the events of: the client
// lists again.
func (s *Server) holdWatch(w http.ResponseWriter, r *http.Request, comp string) {
	apiVersion, kind, rv, items, ok := s.cache.List(comp, keyOf(r))
	if !ok {
		s.refuse(w, r, comp, verbWatch, "the node's cache holds no list of it to watch")
		return
	}
	_, _, back := s.state()
	s.m.requests.WithLabelValues(comp, verbWatch, "cache").Inc()
	q := r.URL.Query()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	if from := q.Get("resourceVersion"); olderThan(from, rv) && q.Get("sendInitialEvents") != "true" {
		_ = enc.Encode(Event{Type: "ERROR", Object: statusJSON(http.StatusGone, "Expired",
			fmt.Sprintf("too old resource version: %s (%s)", from, rv))})
		return
	}
	if q.Get("sendInitialEvents") == "true" {
		for _, it := range items {
			_ = enc.Encode(Event{Type: "ADDED", Object: it})
		}
		mark, _ := json.Marshal(map[string]any{"kind": strings.TrimSuffix(kind, "List"), "apiVersion": apiVersion,
			"metadata": map[string]any{"resourceVersion": rv, "annotations": map[string]string{initialEventsEnd: "true"}}})
		_ = enc.Encode(Event{Type: "BOOKMARK", Object: mark})
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	var timeout <-chan time.Time
	if secs, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && secs > 0 {
		t := time.NewTimer(time.Duration(secs) * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	s.m.heldWatches.Inc()
	defer s.m.heldWatches.Dec()
	select {
	case <-back:
	case <-timeout:
	case <-r.Context().Done():
	case <-s.closing:
	}
}

// olderThan reports whether resource version a is older than b, both
// kube-apiserver's (etcd revisions); "" and "0" (any) are not.
func olderThan(a, b string) bool {
	x, err1 := strconv.ParseUint(a, 10, 64)
	y, err2 := strconv.ParseUint(b, 10, 64)
	return err1 == nil && err2 == nil && x != 0 && x < y
}

// token passes a TokenRequest to kube-apiserver and keeps the token;
// while kube-apiserver is unreachable the same request is answered with
// the token kept for it while that token is valid.
func (s *Server) token(w http.ResponseWriter, r *http.Request, comp string, online bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxTokenRequest+1))
	if err != nil {
		return
	}
	if len(body) > maxTokenRequest {
		writeStatus(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "atoll local API: a TokenRequest of more than 1 MiB")
		return
	}
	sum := sha256.Sum256(body)
	key := r.URL.Path + "#" + hex.EncodeToString(sum[:])
	if !s.wasProbed() {
		// Before the first probe: the kept token, or the probe's answer.
		if s.keptToken(w, comp, key) {
			return
		}
		if !s.waitProbe(r.Context()) {
			return
		}
		online, _, _ = s.state()
	}
	if online {
		resp, err := s.do(r.Context(), r, body, true)
		if err == nil {
			if resp.code == http.StatusCreated && isJSON(resp.header) {
				s.cache.PutToken(comp, key, resp.body)
			}
			s.m.requests.WithLabelValues(comp, verbToken, "apiserver").Inc()
			resp.write(w)
			return
		}
		if r.Context().Err() != nil {
			return
		}
		s.unreachable(err)
	}
	if s.keptToken(w, comp, key) {
		return
	}
	s.refuse(w, r, comp, verbToken, "no valid token was issued for this request before")
}

// keptToken answers with the token kept under key, if it is valid.
func (s *Server) keptToken(w http.ResponseWriter, comp, key string) bool {
	kept, ok := s.cache.Token(comp, key, time.Now())
	if !ok {
		return false
	}
	s.m.requests.WithLabelValues(comp, verbToken, "cache").Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(kept)
	return true
}

// open sends r (with body, when not nil) to kube-apiserver, asking for
// JSON when asJSON.
func (s *Server) open(ctx context.Context, r *http.Request, body []byte, asJSON bool) (*http.Response, error) {
	u := *s.base
	u.Path, u.RawPath, u.RawQuery = r.URL.Path, r.URL.RawPath, r.URL.RawQuery
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	for k, v := range r.Header {
		if !hopByHop(k) {
			out.Header[k] = v
		}
	}
	stripCredentials(out.Header)
	if asJSON {
		out.Header.Set("Accept", "application/json")
	}
	return s.client.Do(out)
}

// answer is kube-apiserver's whole answer to a request.
type answer struct {
	code   int
	header http.Header
	body   []byte
}

func (a answer) write(w http.ResponseWriter) {
	copyHeader(w.Header(), a.header)
	w.WriteHeader(a.code)
	_, _ = w.Write(a.body)
}

// do is open with the answer read whole.
func (s *Server) do(ctx context.Context, r *http.Request, body []byte, asJSON bool) (answer, error) {
	resp, err := s.open(ctx, r, body, asJSON)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return answer{code: resp.StatusCode, header: resp.Header, body: b}, nil
}

// refuse answers 503 ServiceUnavailable, saying why.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, comp, verb, why string) {
	s.m.requests.WithLabelValues(comp, verb, "refused").Inc()
	_, since, _ := s.state()
	writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", fmt.Sprintf(
		"atoll local API: %s %s: kube-apiserver %s is unreachable since %s and %s",
		r.Method, r.URL.Path, s.base.Host, since.UTC().Format(time.RFC3339), why))
}

func statusJSON(code int, reason, msg string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{},
		"status": "Failure", "message": msg, "reason": reason, "code": code})
	return b
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(statusJSON(code, reason, msg))
}

// component names the client by its User-Agent's program
// ("kubelet/v1.36.3 (linux/amd64) kubernetes/…" is kubelet).
func component(r *http.Request) string {
	name, _, _ := strings.Cut(r.UserAgent(), "/")
	name, _, _ = strings.Cut(name, " ")
	var b strings.Builder
	for _, c := range strings.ToLower(name) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			b.WriteRune(c)
		}
	}
	if n := b.String(); n != "" && n != "." && n != ".." && len(n) <= 64 {
		return n
	}
	return "unknown"
}

// classify tells reads, watches, token requests and writes apart.
func classify(r *http.Request) string {
	switch r.Method {
	case http.MethodGet:
		if w := r.URL.Query().Get("watch"); w == "true" || w == "1" || isWatchPath(r.URL.Path) {
			return verbWatch
		}
		return verbRead
	case http.MethodPost:
		if seg := strings.Split(strings.Trim(r.URL.Path, "/"), "/"); len(seg) >= 3 &&
			seg[len(seg)-1] == "token" && seg[len(seg)-3] == "serviceaccounts" {
			return verbToken
		}
	}
	return verbWrite
}

// isWatchPath reports a legacy watch path (/api/v1/watch/…).
func isWatchPath(p string) bool {
	seg := strings.Split(strings.Trim(p, "/"), "/")
	return (len(seg) > 2 && seg[0] == "api" && seg[2] == "watch") || (len(seg) > 3 && seg[0] == "apis" && seg[3] == "watch")
}

// keyOf is what a read or watch is kept under: its collection or
// object (a legacy watch path as its collection) and its selectors.
func keyOf(r *http.Request) string {
	p := r.URL.Path
	if isWatchPath(p) {
		seg := strings.Split(strings.Trim(p, "/"), "/")
		i := 2
		if seg[0] == "apis" {
			i = 3
		}
		p = "/" + strings.Join(append(seg[:i:i], seg[i+1:]...), "/")
	}
	q := r.URL.Query()
	sel := url.Values{}
	for _, k := range []string{"labelSelector", "fieldSelector"} {
		if v := q.Get(k); v != "" {
			sel.Set(k, v)
		}
	}
	if len(sel) == 0 {
		return p
	}
	return p + "?" + sel.Encode()
}

// cacheableRead reports a read whose answer is kept and can be answered
// from the cache: not a table or other transformation, nor a page after
// the first. A first page (limit) is kept when it is the whole list (no
// continue in the answer: client-go's reflectors list with limit=500 and
// kube-apiserver ignores it when it serves from its watch cache), and
// answered whole from the cache, as kube-apiserver may answer one.
func cacheableRead(r *http.Request) bool {
	return r.URL.Query().Get("continue") == "" && !strings.Contains(r.Header.Get("Accept"), "as=")
}

func isJSON(h http.Header) bool {
	t, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && t == "application/json"
}

func hopByHop(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Te", "Trailer", "Content-Length":
		return true
	}
	return false
}

func copyHeader(dst, src http.Header) {
	for k, v := range src {
		if !hopByHop(k) {
			dst[k] = v
		}
	}
}

// stripCredentials removes what a local client could use to act as
// someone else: the node's own credentials are the only ones sent.
func stripCredentials(h http.Header) {
	for k := range h {
		if c := http.CanonicalHeaderKey(k); c == "Authorization" || strings.HasPrefix(c, "Impersonate-") {
			delete(h, k)
		}
	}
}

// clientCert loads the node's client certificate again whenever its
// files change (the kubelet rotates it).
type clientCert struct {
	certFile, keyFile string

	mu    sync.Mutex
	stamp string
	cert  *tls.Certificate
}

func (c *clientCert) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	var stamp strings.Builder
	for _, f := range []string{c.certFile, c.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&stamp, "%d.%d;", fi.ModTime().UnixNano(), fi.Size())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && c.stamp == stamp.String() {
		return c.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		if c.cert != nil {
			return c.cert, nil // half-rotated: the next handshake reads the pair again
		}
		return nil, err
	}
	c.cert, c.stamp = &cert, stamp.String()
	return c.cert, nil
}
