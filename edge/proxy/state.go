package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/internal/objectview"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// StateFile is the name of the proxy's state snapshot in its state
// directory, and LogFile the log of the changes since it.
const (
	StateFile = "proxy.pb"
	LogFile   = "proxy.log"
)

// StateLayout is the layout of the state this proxy writes
// (proxy.proto, ProxyState.layout): the raw views of each Space with its
// cursor, and the objects served. A state of another layout is not read:
// the proxy reads its views from the hub again.
const StateLayout = 1

// rawKey names one raw object of a space.
type rawKey struct {
	sp Space
	objectKey
}

// disk is what changed since the last save.
type disk struct {
	raw            map[rawKey]struct{}
	served, pruned map[objectKey]struct{}
	// full: the next save writes a snapshot (none on disk yet, a reset,
	// a failed save, a torn log).
	full bool
	// The scalars as last saved.
	rev, compacted uint64
	seq            [2]uint64
	created        [2]int64
}

func (d *disk) reset() {
	d.raw, d.served, d.pruned = map[rawKey]struct{}{}, map[objectKey]struct{}{}, map[objectKey]struct{}{}
}

// saver is the state of the files, owned by Save.
type saver struct {
	mu                  sync.Mutex
	log                 *os.File // open for appending, nil: open at the next append
	snapBytes, logBytes int64
}

// Unit is the unit whose views the store holds ("" before any).
func (s *Store) Unit() string { s.mu.RLock(); defer s.mu.RUnlock(); return s.unit }

// Reset makes the unit's space unit's, to be read from its start. The
// old unit's Nodes stay until that read ends (the follower reloads a
// space whose cursor is at its start while it holds views: reload.go),
// so the host keeps serving what it served until the new unit's views
// replace them, instead of nothing in between. The shared space is the
// same for every unit and stays. The revision keeps growing.
func (s *Store) Reset(unit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unit = unit
	s.cur[UnitSpace] = cursor{}
	s.dirty.full = true
	s.notify()
}

// Advance records that space sp was read up to seq (a view the proxy does
// not serve).
func (s *Store) Advance(sp Space, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.cur[sp].seq {
		s.cur[sp].seq = seq
		s.notify()
	}
}

// Snapshot returns the store's state. The objects' encodings are the
// ones made when they changed (the views as received, the served objects
// as last computed), so a snapshot encodes nothing again. The messages
// are shared with the store: read them, do not modify them.
func (s *Store) Snapshot() (*atollv1.ProxyState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.snapshot()
}

// snapshot: call with mu held.
func (s *Store) snapshot() (*atollv1.ProxyState, error) {
	st := &atollv1.ProxyState{Unit: s.unit, Host: s.host, Rev: s.rev, Compacted: s.compacted, Generation: s.generation,
		Layout: StateLayout,
		Seq:    s.cur[UnitSpace].seq, StreamCreated: s.cur[UnitSpace].created,
		SharedSeq: s.cur[SharedSpace].seq, SharedStreamCreated: s.cur[SharedSpace].created}
	for _, kind := range objectview.Kinds {
		for _, sp := range Spaces {
			for _, k := range slices.Sorted(mapKeys(s.layers[sp].objs[kind])) {
				v, err := s.rawView(sp, kind, k)
				if err != nil {
					return nil, err
				}
				if sp == UnitSpace {
					st.Raw = append(st.Raw, v)
				} else {
					st.SharedRaw = append(st.SharedRaw, v)
				}
			}
		}
		for _, k := range slices.Sorted(mapKeys(s.served[kind])) {
			so, err := s.servedObject(kind, k)
			if err != nil {
				return nil, err
			}
			st.Served = append(st.Served, so)
		}
	}
	return st, nil
}

// rawView is the raw object of space sp at kind/k as received, or a
// deletion when there is none. Call with mu held.
func (s *Store) rawView(sp Space, kind, k string) (*atollv1.ObjectView, error) {
	o, ok := s.layers[sp].objs[kind][k]
	if !ok {
		ns, name := splitKey(k)
		return &atollv1.ObjectView{Kind: kind, Namespace: ns, Name: name, Deleted: true}, nil
	}
	if v := s.layers[sp].views[kind][k]; v != nil {
		return v, nil
	}
	return objectview.Encode(kind, o)
}

// servedObject is the served object (or tombstone) at kind/k, which
// exists. Call with mu held.
func (s *Store) servedObject(kind, k string) (*atollv1.ServedObject, error) {
	e := s.served[kind][k]
	v := e.view
	if v == nil {
		var err error
		if v, err = objectview.Encode(kind, e.obj); err != nil {
			return nil, err
		}
	}
	return &atollv1.ServedObject{View: v, Rv: e.rv, Created: e.created, Deleted: e.deleted}, nil
}

// take returns what the next save writes and forgets it as changed: a
// snapshot (with a new generation) when one is due or compact is set,
// else a record of what changed, else neither (nothing changed).
func (s *Store) take(compact bool) (*atollv1.ProxyState, *atollv1.ProxyStateRecord, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := &s.dirty
	if d.full || compact {
		s.generation++
		st, err := s.snapshot()
		if err != nil {
			d.full = true
			return nil, nil, err
		}
		s.taken()
		return st, nil, nil
	}
	if len(d.raw)+len(d.served)+len(d.pruned) == 0 && d.rev == s.rev && d.compacted == s.compacted &&
		d.seq == [2]uint64{s.cur[0].seq, s.cur[1].seq} && d.created == [2]int64{s.cur[0].created, s.cur[1].created} {
		return nil, nil, nil
	}
	rec := &atollv1.ProxyStateRecord{Generation: s.generation, Rev: s.rev, Compacted: s.compacted,
		Seq: s.cur[UnitSpace].seq, StreamCreated: s.cur[UnitSpace].created,
		SharedSeq: s.cur[SharedSpace].seq, SharedStreamCreated: s.cur[SharedSpace].created}
	for _, sp := range Spaces {
		var keys []objectKey
		for rk := range d.raw {
			if rk.sp == sp {
				keys = append(keys, rk.objectKey)
			}
		}
		for _, ok := range sortedKeys(keys) {
			v, err := s.rawView(sp, ok.kind, ok.key)
			if err != nil {
				d.full = true
				return nil, nil, err
			}
			if sp == UnitSpace {
				rec.Raw = append(rec.Raw, v)
			} else {
				rec.SharedRaw = append(rec.SharedRaw, v)
			}
		}
	}
	for _, ok := range sortedKeys(slices.Collect(mapKeys(d.served))) {
		so, err := s.servedObject(ok.kind, ok.key)
		if err != nil {
			d.full = true
			return nil, nil, err
		}
		rec.Served = append(rec.Served, so)
	}
	for _, ok := range sortedKeys(slices.Collect(mapKeys(d.pruned))) {
		ns, name := splitKey(ok.key)
		rec.Pruned = append(rec.Pruned, &atollv1.ObjectView{Kind: ok.kind, Namespace: ns, Name: name, Deleted: true})
	}
	s.taken()
	return nil, rec, nil
}

// taken records that the state as it is now is being saved. Call with mu
// held.
func (s *Store) taken() {
	s.dirty.reset()
	s.dirty.full = false
	s.dirty.rev, s.dirty.compacted = s.rev, s.compacted
	s.dirty.seq = [2]uint64{s.cur[0].seq, s.cur[1].seq}
	s.dirty.created = [2]int64{s.cur[0].created, s.cur[1].created}
}

func sortedKeys(out []objectKey) []objectKey {
	slices.SortFunc(out, func(a, b objectKey) int {
		if a.kind != b.kind {
			return cmpString(a.kind, b.kind)
		}
		return cmpString(a.key, b.key)
	})
	return out
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Restore replaces the store's state with st (of the same host and of
// StateLayout).
func (s *Store) Restore(st *atollv1.ProxyState) error {
	if st.GetHost() != s.host {
		return fmt.Errorf("proxy: state of host %q, not %q", st.GetHost(), s.host)
	}
	if st.GetLayout() != StateLayout {
		return fmt.Errorf("proxy: state of layout %d, not %d", st.GetLayout(), StateLayout)
	}
	layers := [2]layer{newLayer(), newLayer()}
	served := map[string]map[string]*entry{}
	for _, k := range objectview.Kinds {
		served[k] = map[string]*entry{}
	}
	add := func(sp Space, v *atollv1.ObjectView) error {
		if _, ok := objectview.Kind(v.GetKind()); !ok {
			return fmt.Errorf("proxy: state: raw view of unknown kind %q", v.GetKind())
		}
		o, err := objectview.Decode(v)
		if err != nil {
			return err
		}
		k := objKey(v.GetNamespace(), v.GetName())
		layers[sp].objs[v.GetKind()][k], layers[sp].views[v.GetKind()][k] = o, v
		return nil
	}
	for _, v := range st.GetRaw() {
		if err := add(UnitSpace, v); err != nil {
			return err
		}
	}
	for _, v := range st.GetSharedRaw() {
		if err := add(SharedSpace, v); err != nil {
			return err
		}
	}
	tombstones := 0
	for _, so := range st.GetServed() {
		v := so.GetView()
		if _, ok := objectview.Kind(v.GetKind()); !ok {
			return fmt.Errorf("proxy: state: served object of unknown kind %q", v.GetKind())
		}
		o, err := objectview.Decode(v)
		if err != nil {
			return err
		}
		served[v.GetKind()][objKey(v.GetNamespace(), v.GetName())] = &entry{
			obj: o, fp: digest(v.GetKind(), o), rv: so.GetRv(), created: so.GetCreated(), deleted: so.GetDeleted(), view: v,
		}
		if so.GetDeleted() {
			tombstones++
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unit, s.rev, s.compacted, s.generation = st.GetUnit(), st.GetRev(), st.GetCompacted(), st.GetGeneration()
	s.cur[UnitSpace] = cursor{seq: st.GetSeq(), created: st.GetStreamCreated()}
	s.cur[SharedSpace] = cursor{seq: st.GetSharedSeq(), created: st.GetSharedStreamCreated()}
	s.layers, s.served, s.tombstones = layers, served, tombstones
	s.raw = map[string]map[string]objectview.Object{}
	for _, kind := range objectview.Kinds {
		s.raw[kind] = map[string]objectview.Object{}
		for _, sp := range []Space{SharedSpace, UnitSpace} { // the unit's Nodes win
			maps.Copy(s.raw[kind], layers[sp].objs[kind])
		}
	}
	if n, ok := s.raw[objectview.KindNodes][s.host]; ok {
		s.hostLast = n.GetLabels()
	}
	s.bySvc = map[string]map[string]struct{}{}
	for k, o := range s.raw[objectview.KindEndpointSlices] {
		s.indexSlice(k, nil, o)
	}
	s.taken()
	return nil
}

// Save writes what changed since the last save to dir: a record appended
// to the log (and fsynced), or, first, after a reset or a failure, or
// when the log has grown past the snapshot, a new snapshot (temporary
// file, fsync, rename) and an empty log. The store's lock is held only to
// collect the changed objects (already encoded), not to marshal or write.
// It returns the bytes the state takes on disk.
func (s *Store) Save(dir string) (int64, error) {
	sv := &s.saver
	sv.mu.Lock()
	defer sv.mu.Unlock()
	st, rec, err := s.take(sv.logBytes > sv.snapBytes)
	if err == nil {
		switch {
		case st != nil:
			err = sv.writeSnapshot(dir, st)
		case rec != nil:
			err = sv.append(dir, rec)
		}
	}
	if err != nil {
		s.mu.Lock()
		s.dirty.full = true
		s.mu.Unlock()
		return 0, err
	}
	return sv.snapBytes + sv.logBytes, nil
}

func (sv *saver) writeSnapshot(dir string, st *atollv1.ProxyState) error {
	b, err := proto.Marshal(st)
	if err != nil {
		return fmt.Errorf("proxy: encode state: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("proxy: state dir: %w", err)
	}
	f, err := os.CreateTemp(dir, StateFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("proxy: save state: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("proxy: save state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("proxy: save state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("proxy: save state: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, StateFile)); err != nil {
		return fmt.Errorf("proxy: save state: %w", err)
	}
	syncDir(dir)
	sv.snapBytes = int64(len(b))
	// The log's records are of the previous generation now: empty it. A
	// crash before this leaves them, and loading ignores them.
	if sv.log != nil {
		sv.log.Close()
		sv.log = nil
	}
	sv.logBytes = 0
	if err := os.Truncate(filepath.Join(dir, LogFile), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("proxy: empty the state log: %w", err)
	}
	return nil
}

// A log record is the length of its body (uvarint), the body's CRC-32C
// (4 bytes, little endian) and the body, a ProxyStateRecord.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

func (sv *saver) append(dir string, rec *atollv1.ProxyStateRecord) error {
	body, err := proto.Marshal(rec)
	if err != nil {
		return fmt.Errorf("proxy: encode state record: %w", err)
	}
	if sv.log == nil {
		f, err := os.OpenFile(filepath.Join(dir, LogFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("proxy: open the state log: %w", err)
		}
		sv.log = f
	}
	b := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen64+4), uint64(len(body)))
	b = binary.LittleEndian.AppendUint32(b, crc32.Checksum(body, crcTable))
	b = append(b, body...)
	if _, err := sv.log.Write(b); err != nil {
		return fmt.Errorf("proxy: append to the state log: %w", err)
	}
	if err := sv.log.Sync(); err != nil {
		return fmt.Errorf("proxy: append to the state log: %w", err)
	}
	sv.logBytes += int64(len(b))
	return nil
}

// Close closes the log (the proxy's end).
func (s *Store) Close() {
	s.saver.mu.Lock()
	defer s.saver.mu.Unlock()
	if s.saver.log != nil {
		s.saver.log.Close()
		s.saver.log = nil
	}
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// readLog returns the records of log b, up to the first torn or
// corrupt one (a crash in the middle of an append), the length of that
// valid prefix, and whether anything followed it.
func readLog(b []byte) ([]*atollv1.ProxyStateRecord, int64, bool) {
	var recs []*atollv1.ProxyStateRecord
	off := 0
	for off < len(b) {
		n, w := binary.Uvarint(b[off:])
		if w <= 0 || len(b)-off-w < 4 || n > uint64(len(b)-off-w-4) {
			return recs, int64(off), true
		}
		sum := binary.LittleEndian.Uint32(b[off+w:])
		body := b[off+w+4 : off+w+4+int(n)]
		var rec atollv1.ProxyStateRecord
		if crc32.Checksum(body, crcTable) != sum || proto.Unmarshal(body, &rec) != nil {
			return recs, int64(off), true
		}
		recs = append(recs, &rec)
		off += w + 4 + int(n)
	}
	return recs, int64(off), false
}

// replay applies the records of st's generation to st, in order.
func replay(st *atollv1.ProxyState, recs []*atollv1.ProxyStateRecord) int {
	type key struct{ kind, ns, name string }
	kv := func(v *atollv1.ObjectView) key { return key{v.GetKind(), v.GetNamespace(), v.GetName()} }
	raw, sharedRaw := map[key]*atollv1.ObjectView{}, map[key]*atollv1.ObjectView{}
	served := map[key]*atollv1.ServedObject{}
	for _, v := range st.GetRaw() {
		raw[kv(v)] = v
	}
	for _, v := range st.GetSharedRaw() {
		sharedRaw[kv(v)] = v
	}
	for _, so := range st.GetServed() {
		served[kv(so.GetView())] = so
	}
	n := 0
	for _, rec := range recs {
		if rec.GetGeneration() != st.GetGeneration() {
			continue
		}
		n++
		st.Seq, st.Rev, st.Compacted, st.StreamCreated = rec.GetSeq(), rec.GetRev(), rec.GetCompacted(), rec.GetStreamCreated()
		st.SharedSeq, st.SharedStreamCreated = rec.GetSharedSeq(), rec.GetSharedStreamCreated()
		for m, vs := range map[*map[key]*atollv1.ObjectView][]*atollv1.ObjectView{&raw: rec.GetRaw(), &sharedRaw: rec.GetSharedRaw()} {
			for _, v := range vs {
				if v.GetDeleted() {
					delete(*m, kv(v))
				} else {
					(*m)[kv(v)] = v
				}
			}
		}
		for _, so := range rec.GetServed() {
			served[kv(so.GetView())] = so
		}
		for _, v := range rec.GetPruned() {
			delete(served, kv(v))
		}
	}
	if n == 0 {
		return 0
	}
	less := func(a, b key) int {
		if c := cmpString(a.kind, b.kind); c != 0 {
			return c
		}
		if c := cmpString(a.ns, b.ns); c != 0 {
			return c
		}
		return cmpString(a.name, b.name)
	}
	st.Raw, st.SharedRaw, st.Served = st.Raw[:0], st.SharedRaw[:0], st.Served[:0]
	for _, k := range slices.SortedFunc(mapKeys(raw), less) {
		st.Raw = append(st.Raw, raw[k])
	}
	for _, k := range slices.SortedFunc(mapKeys(sharedRaw), less) {
		st.SharedRaw = append(st.SharedRaw, sharedRaw[k])
	}
	for _, k := range slices.SortedFunc(mapKeys(served), less) {
		st.Served = append(st.Served, served[k])
	}
	return n
}

// Load restores the store from dir: the snapshot, then the records of
// its generation in the log, up to a torn last one (which the next save
// replaces with a new snapshot). A missing snapshot is no error (and no
// state, whatever the log holds).
func (s *Store) Load(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("proxy: load state: %w", err)
	}
	var st atollv1.ProxyState
	if err := proto.Unmarshal(b, &st); err != nil {
		return false, fmt.Errorf("proxy: load state: %w", err)
	}
	lb, err := readFile(filepath.Join(dir, LogFile))
	if err != nil {
		return false, fmt.Errorf("proxy: load state log: %w", err)
	}
	recs, valid, torn := readLog(lb)
	replay(&st, recs)
	if err := s.Restore(&st); err != nil {
		return false, err
	}
	s.saver.mu.Lock()
	s.saver.snapBytes, s.saver.logBytes = int64(len(b)), valid
	s.saver.mu.Unlock()
	if torn {
		s.mu.Lock()
		s.dirty.full = true
		s.mu.Unlock()
	}
	return true, nil
}

// readFile reads path; a missing file is empty.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}
