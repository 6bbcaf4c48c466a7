package localapi

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/internal/atomicfile"
)

// What a record keeps: the items of a list (updated by the watches of
// the same collection), one object, or an issued service-account token.
const (
	recList   = "list"
	recObject = "object"
	recToken  = "token"
)

// record is one answer a component got, as kept on disk.
type record struct {
	Key  string `json:"key"`
	Type string `json:"type"`
	// APIVersion, Kind and RV describe a list (its kind, e.g. PodList, and
	// the resource version it is current at).
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	RV         string `json:"resourceVersion,omitempty"`
	// Items are a list's objects by namespace/name, each with its kind.
	Items map[string]json.RawMessage `json:"items,omitempty"`
	// Body is an object or a TokenRequest as kube-apiserver answered it.
	Body json.RawMessage `json:"body,omitempty"`
	// Expires is when a token stops being valid.
	Expires time.Time `json:"expires,omitzero"`
	// Used is when a component last asked for it (to within
	// usedResolution); a record unused for the cache's retention is
	// dropped.
	Used time.Time `json:"used,omitzero"`
}

// usedResolution is how stale a record's Used may get before a use
// writes it again: uses cost no write in between.
const usedResolution = time.Hour

// meta is what the cache reads of an object.
type meta struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Namespace       string            `json:"namespace"`
		Name            string            `json:"name"`
		ResourceVersion string            `json:"resourceVersion"`
		Continue        string            `json:"continue"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
}

func (m meta) key() string {
	if m.Metadata.Namespace == "" {
		return m.Metadata.Name
	}
	return m.Metadata.Namespace + "/" + m.Metadata.Name
}

// Cache holds what each of the node's components read from
// kube-apiserver, in memory and on disk (Dir/<component>/<digest>.json,
// written by Flush). A record that does not load is named in the log,
// removed and fetched again when the component next reads it online.
type Cache struct {
	dir    string
	retain time.Duration
	log    *slog.Logger
	m      *metrics
	now    func() time.Time

	mu    sync.Mutex
	recs  map[string]*record // by component "\x00" key
	dirty map[string]bool
	// failing is set from a flush that could not write until one that
	// wrote everything: the failure is logged once.
	failing bool
}

func recID(component, key string) string { return component + "\x00" + key }

// file is where the record of component's key is kept.
func (c *Cache) file(id string) string {
	component, key, _ := strings.Cut(id, "\x00")
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(c.dir, component, hex.EncodeToString(sum[:12])+".json")
}

// OpenCache loads the records kept in dir; a record no component asks for
// in retain is dropped.
func OpenCache(dir string, retain time.Duration, log *slog.Logger, m *metrics) (*Cache, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("local API cache: %w", err)
	}
	c := &Cache{dir: dir, retain: retain, log: log, m: m, now: time.Now, recs: map[string]*record{}, dirty: map[string]bool{}}
	// A write cut short by a power cut leaves its temporary file.
	if tmps, err := filepath.Glob(filepath.Join(dir, "*", atomicfile.TempPrefix+"*")); err == nil {
		for _, f := range tmps {
			_ = os.Remove(f)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.json"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		component := filepath.Base(filepath.Dir(f))
		r, err := readRecord(f)
		if err == nil && c.file(recID(component, r.Key)) != f {
			err = errors.New("its key does not match its name")
		}
		if err != nil {
			log.Warn("local API cache: ignoring a record that does not load; it is fetched again online", "file", f, "err", err)
			m.corrupt.Inc()
			_ = os.Remove(f)
			continue
		}
		if r.Used.IsZero() {
			r.Used = c.now()
		}
		c.recs[recID(component, r.Key)] = r
	}
	m.records.Set(float64(len(c.recs)))
	return c, nil
}

func readRecord(f string) (*record, error) {
	b, err := os.ReadFile(f)
	if err != nil {
		return nil, err
	}
	r := &record{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, err
	}
	switch {
	case r.Key == "":
		return nil, errors.New("no key")
	case r.Type == recList && (r.Kind == "" || r.APIVersion == ""):
		return nil, errors.New("a list without its kind")
	case r.Type != recList && len(r.Body) == 0:
		return nil, fmt.Errorf("a %q record without its body", r.Type)
	case r.Type != recList && r.Type != recObject && r.Type != recToken:
		return nil, fmt.Errorf("unknown type %q", r.Type)
	}
	if r.Type == recList && r.Items == nil {
		r.Items = map[string]json.RawMessage{}
	}
	return r, nil
}

func (c *Cache) set(component, key string, r *record) {
	id := recID(component, key)
	r.Used = c.now()
	c.recs[id] = r
	c.dirty[id] = true
	c.m.records.Set(float64(len(c.recs)))
}

// touch records a use of r (c.mu held).
func (c *Cache) touch(id string, r *record) {
	if now := c.now(); now.Sub(r.Used) > usedResolution {
		r.Used = now
		c.dirty[id] = true
	}
}

// PutList keeps a list kube-apiserver answered. A list it cannot read,
// or a page of one, is not kept.
func (c *Cache) PutList(component, key string, body []byte) {
	var l struct {
		meta
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil || !strings.HasSuffix(l.Kind, "List") || l.Metadata.Continue != "" {
		return
	}
	itemKind := strings.TrimSuffix(l.Kind, "List")
	items := make(map[string]json.RawMessage, len(l.Items))
	for _, raw := range l.Items {
		var m meta
		if err := json.Unmarshal(raw, &m); err != nil {
			return
		}
		if m.Kind == "" {
			raw = withKind(raw, itemKind, l.APIVersion)
		}
		items[m.key()] = raw
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(component, key, &record{Key: key, Type: recList, APIVersion: l.APIVersion, Kind: l.Kind, RV: l.Metadata.ResourceVersion, Items: items})
}

// withKind gives an item of a list the kind and apiVersion a watch event
// carries.
func withKind(raw json.RawMessage, kind, apiVersion string) json.RawMessage {
	head, _ := json.Marshal(map[string]string{"kind": kind, "apiVersion": apiVersion})
	var b bytes.Buffer
	b.Write(head[:len(head)-1])
	rest := bytes.TrimSpace(bytes.TrimSpace(raw)[1:])
	if len(rest) > 0 && rest[0] != '}' {
		b.WriteByte(',')
	}
	b.Write(rest)
	return b.Bytes()
}

// ReplaceList keeps a whole list delivered by a watch's initial events.
func (c *Cache) ReplaceList(component, key, apiVersion, kind, rv string, items map[string]json.RawMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(component, key, &record{Key: key, Type: recList, APIVersion: apiVersion, Kind: kind, RV: rv, Items: items})
}

// PutObject keeps one object kube-apiserver answered.
func (c *Cache) PutObject(component, key string, body []byte) {
	if !json.Valid(body) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	if r, ok := c.recs[id]; ok && r.Type == recObject {
		if bytes.Equal(r.Body, body) {
			return
		}
		if heartbeatOnly(r.Body, body) {
			r.Body = bytes.Clone(body) // written with the next real change
			c.touch(id, r)
			return
		}
	}
	c.set(component, key, &record{Key: key, Type: recObject, Body: bytes.Clone(body)})
}

// Forget drops what component kept under key (kube-apiserver answered
// that it is gone).
func (c *Cache) Forget(component, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	if _, ok := c.recs[id]; ok {
		delete(c.recs, id)
		c.dirty[id] = true
		c.m.records.Set(float64(len(c.recs)))
	}
}

// PutToken keeps a TokenRequest kube-apiserver answered, until it
// expires.
func (c *Cache) PutToken(component, key string, body []byte) {
	var t struct {
		Status struct {
			ExpirationTimestamp time.Time `json:"expirationTimestamp"`
		} `json:"status"`
	}
	if err := json.Unmarshal(body, &t); err != nil || t.Status.ExpirationTimestamp.IsZero() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set(component, key, &record{Key: key, Type: recToken, Body: bytes.Clone(body), Expires: t.Status.ExpirationTimestamp})
}

// Event is one watch event of a collection.
type Event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// Apply brings component's list under key up to date with a watch
// event. It reports false when no list is kept there (the event is then
// not kept: a collection is only kept whole).
func (c *Cache) Apply(component, key string, ev Event) bool {
	var m meta
	if err := json.Unmarshal(ev.Object, &m); err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	r, ok := c.recs[id]
	if !ok || r.Type != recList {
		return false
	}
	c.touch(id, r)
	if m.Metadata.ResourceVersion != "" {
		r.RV = m.Metadata.ResourceVersion
	}
	switch ev.Type {
	case "ADDED", "MODIFIED":
		old, had := r.Items[m.key()]
		r.Items[m.key()] = bytes.Clone(ev.Object)
		if had && heartbeatOnly(old, ev.Object) {
			return true // kept in memory, written with the next real change
		}
	case "DELETED":
		delete(r.Items, m.key())
	default:
		// A bookmark moves the resource version alone: kept in memory,
		// written with the next change (a list on disk at an older
		// version is still the list as it was then).
		return true
	}
	c.dirty[id] = true
	return true
}

// List is component's list under key as kube-apiserver would answer
// it: its kind, resource version and items (sorted by namespace/name).
func (c *Cache) List(component, key string) (apiVersion, kind, rv string, items []json.RawMessage, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	r, ok := c.recs[id]
	if !ok || r.Type != recList {
		return "", "", "", nil, false
	}
	c.touch(id, r)
	for _, k := range slices.Sorted(maps.Keys(r.Items)) {
		items = append(items, r.Items[k])
	}
	return r.APIVersion, r.Kind, r.RV, items, true
}

// Has reports whether component kept an answer under key.
func (c *Cache) Has(component, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.recs[recID(component, key)]
	return ok
}

// Object is what component last read at key.
func (c *Cache) Object(component, key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	r, ok := c.recs[id]
	if !ok || r.Type != recObject {
		return nil, false
	}
	c.touch(id, r)
	return r.Body, true
}

// Token is the TokenRequest component was last answered under key, if
// it is still valid at now.
func (c *Cache) Token(component, key string, now time.Time) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id := recID(component, key)
	r, ok := c.recs[id]
	if !ok || r.Type != recToken || !now.Before(r.Expires) {
		return nil, false
	}
	c.touch(id, r)
	return r.Body, true
}

// Flush drops the records unused for the retention and writes the
// records changed since the last flush. A record that cannot be written
// (a full disk) stays in memory and is tried again at the next flush.
func (c *Cache) Flush() error {
	c.mu.Lock()
	for id, r := range c.recs {
		if c.retain > 0 && c.now().Sub(r.Used) > c.retain {
			delete(c.recs, id)
			c.dirty[id] = true
			c.m.expired.Inc()
		}
	}
	c.m.records.Set(float64(len(c.recs)))
	type write struct {
		file                string
		component, resource string
		data                []byte // nil: remove
	}
	var writes []write
	for id := range c.dirty {
		component, key, _ := strings.Cut(id, "\x00")
		w := write{file: c.file(id), component: component, resource: resourceOf(key)}
		if r, ok := c.recs[id]; ok {
			var err error
			if w.data, err = json.Marshal(r); err != nil {
				c.mu.Unlock()
				return err
			}
		}
		writes = append(writes, w)
	}
	clear(c.dirty)
	c.mu.Unlock()
	var errs []error
	for _, w := range writes {
		var err error
		if w.data == nil {
			if err = os.Remove(w.file); errors.Is(err, os.ErrNotExist) {
				err = nil
			}
		} else {
			err = atomicfile.Write(w.file, w.data, 0o600)
		}
		if err != nil {
			errs = append(errs, err)
			c.redirty(w.file)
			continue
		}
		c.m.writes.WithLabelValues(w.component, w.resource).Inc()
		c.m.writtenBytes.Add(float64(len(w.data)))
	}
	err := errors.Join(errs...)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil && !c.failing:
		c.failing = true
		c.m.writeErrors.Inc()
		c.log.Error("local API cache: cannot write; kept in memory and tried again at each flush", "records", len(errs), "err", errs[0])
	case err != nil:
		c.m.writeErrors.Inc()
	case c.failing:
		c.failing = false
		c.log.Info("local API cache: writing again")
	}
	return err
}

// redirty marks the record kept in file as changed again.
func (c *Cache) redirty(file string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.recs {
		if c.file(id) == file {
			c.dirty[id] = true
			return
		}
	}
}

// resourceOf is the resource (and subresource) a record's key reads:
// "/api/v1/namespaces/default/pods?…" is "pods",
// "/api/v1/namespaces/default/serviceaccounts/default/token#…" is
// "serviceaccounts/token".
func resourceOf(key string) string {
	p, _, _ := strings.Cut(key, "?")
	p, _, _ = strings.Cut(p, "#")
	seg := strings.Split(strings.Trim(p, "/"), "/")
	switch {
	case len(seg) >= 2 && seg[0] == "api":
		seg = seg[2:]
	case len(seg) >= 3 && seg[0] == "apis":
		seg = seg[3:]
	default:
		return "other"
	}
	if len(seg) >= 3 && seg[0] == "namespaces" {
		seg = seg[2:]
	}
	switch len(seg) {
	case 0:
		return "other"
	case 1, 2:
		return seg[0]
	default:
		return seg[0] + "/" + seg[2]
	}
}

// heartbeatOnly reports whether object b differs from a only in what a
// status report renews each time though nothing changed: the resource
// version, managedFields and the conditions' lastHeartbeatTime (the
// kubelet's Node, every nodeStatusReportFrequency). Such a change is kept
// in memory and reaches the disk with the next real one, so a quiet node
// writes nothing; after a power cut the Node shows an older heartbeat,
// which no component acts on offline.
func heartbeatOnly(a, b []byte) bool {
	if !bytes.Contains(b, []byte(`"lastHeartbeatTime"`)) {
		return false
	}
	var x, y map[string]any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(withoutHeartbeat(x), withoutHeartbeat(y))
}

func withoutHeartbeat(o map[string]any) map[string]any {
	if md, ok := o["metadata"].(map[string]any); ok {
		delete(md, "resourceVersion")
		delete(md, "managedFields")
	}
	if st, ok := o["status"].(map[string]any); ok {
		conds, _ := st["conditions"].([]any)
		for _, c := range conds {
			if cm, ok := c.(map[string]any); ok {
				delete(cm, "lastHeartbeatTime")
			}
		}
	}
	return o
}
