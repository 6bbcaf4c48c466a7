package proxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/internal/objectview"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// StateFile is the name of the proxy's state in its state directory.
const StateFile = "proxy.pb"

// Unit is the unit whose views the store holds ("" before any).
func (s *Store) Unit() string { s.mu.RLock(); defer s.mu.RUnlock(); return s.unit }

// Reset empties the store for unit: every served object is deleted (its
// watchers see it go) and the stream is read again from its start. The
// revision keeps growing.
func (s *Store) Reset(unit string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unit, s.seq = unit, 0
	for _, kind := range objectview.Kinds {
		for _, k := range slices.Sorted(mapKeys(s.raw[kind])) {
			delete(s.raw[kind], k)
		}
		s.rawViews[kind] = map[string]*atollv1.ObjectView{}
	}
	for _, kind := range objectview.Kinds {
		for _, k := range slices.Sorted(mapKeys(s.served[kind])) {
			s.recompute(kind, k)
		}
	}
	s.notify()
}

// Advance records that the stream was read up to seq (a view of another
// kind, which the proxy does not serve).
func (s *Store) Advance(seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq > s.seq {
		s.seq = seq
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
	st := &atollv1.ProxyState{Unit: s.unit, Host: s.host, Seq: s.seq, Rev: s.rev, Compacted: s.compacted}
	for _, kind := range objectview.Kinds {
		for _, k := range slices.Sorted(mapKeys(s.raw[kind])) {
			v := s.rawViews[kind][k]
			if v == nil {
				var err error
				if v, err = objectview.Encode(kind, s.raw[kind][k]); err != nil {
					return nil, err
				}
			}
			st.Raw = append(st.Raw, v)
		}
		for _, k := range slices.Sorted(mapKeys(s.served[kind])) {
			e := s.served[kind][k]
			v := e.view
			if v == nil {
				var err error
				if v, err = objectview.Encode(kind, e.obj); err != nil {
					return nil, err
				}
			}
			st.Served = append(st.Served, &atollv1.ServedObject{View: v, Rv: e.rv, Created: e.created, Deleted: e.deleted})
		}
	}
	return st, nil
}

// Restore replaces the store's state with st (of the same host).
func (s *Store) Restore(st *atollv1.ProxyState) error {
	if st.GetHost() != s.host {
		return fmt.Errorf("proxy: state of host %q, not %q", st.GetHost(), s.host)
	}
	raw := map[string]map[string]objectview.Object{}
	rawViews := map[string]map[string]*atollv1.ObjectView{}
	served := map[string]map[string]*entry{}
	for _, k := range objectview.Kinds {
		raw[k], rawViews[k], served[k] = map[string]objectview.Object{}, map[string]*atollv1.ObjectView{}, map[string]*entry{}
	}
	tombstones := 0
	for _, v := range st.GetRaw() {
		o, err := objectview.Decode(v)
		if err != nil {
			return err
		}
		raw[v.GetKind()][objKey(v.GetNamespace(), v.GetName())] = o
		rawViews[v.GetKind()][objKey(v.GetNamespace(), v.GetName())] = v
	}
	for _, so := range st.GetServed() {
		v := so.GetView()
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
	s.unit, s.seq, s.rev, s.compacted = st.GetUnit(), st.GetSeq(), st.GetRev(), st.GetCompacted()
	s.raw, s.rawViews, s.served, s.tombstones = raw, rawViews, served, tombstones
	return nil
}

// Save writes the store's state to dir atomically (a temporary file
// renamed over the last one).
func (s *Store) Save(dir string) (int, error) {
	st, err := s.Snapshot()
	if err != nil {
		return 0, err
	}
	b, err := proto.Marshal(st)
	if err != nil {
		return 0, fmt.Errorf("proxy: encode state: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("proxy: state dir: %w", err)
	}
	f, err := os.CreateTemp(dir, StateFile+".tmp-*")
	if err != nil {
		return 0, fmt.Errorf("proxy: save state: %w", err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(b); err != nil {
		f.Close()
		return 0, fmt.Errorf("proxy: save state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, fmt.Errorf("proxy: save state: %w", err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("proxy: save state: %w", err)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, StateFile)); err != nil {
		return 0, fmt.Errorf("proxy: save state: %w", err)
	}
	return len(b), nil
}

// Load restores the store from dir; a missing file is no error.
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
	if err := s.Restore(&st); err != nil {
		return false, err
	}
	return true, nil
}
