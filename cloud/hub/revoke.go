package hub

import (
	"context"
	"crypto/sha256"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// revocationSweep is how often live leaf connections are checked against
// the registry even when nothing was revoked: it closes a connection that
// authenticated in the instant its key was being removed.
const revocationSweep = 2 * time.Second

// enforce keeps live leaf connections in line with the registry until ctx
// is done: it re-reads the edge keys file, and closes every leaf
// connection whose edge key is no longer enrolled, right after a
// revocation and on a slow sweep.
func (h *Hub) enforce(ctx context.Context) {
	sweep := time.NewTicker(revocationSweep)
	defer sweep.Stop()
	var reload <-chan time.Time
	if h.cfg.EdgeKeysFile != "" {
		t := time.NewTicker(h.cfg.EdgeKeysReload)
		defer t.Stop()
		reload = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
			h.reloadEdgeKeys()
			continue // a change pokes Revoked
		case <-h.ids.Revoked():
		case <-sweep.C:
		}
		h.closeRevoked()
	}
}

// closeRevoked closes the leaf connections of revoked edge keys.
func (h *Hub) closeRevoked() {
	alive := func(id uint64) bool { return h.srv.GetLeafNode(id) != nil }
	for id, node := range h.ids.Stale(alive, time.Now()) {
		if err := h.srv.DisconnectClientByID(id); err != nil {
			continue // already gone
		}
		h.revocations.Add(1)
		h.log.Warn("closed the leaf connection of a revoked edge", "edge", node, "cid", id)
	}
}

// reloadEdgeKeys applies the edge keys file when its content changed:
// new and re-keyed nodes are enrolled, nodes no longer listed are removed
// (which closes their links). A file that cannot be read or parsed leaves
// the registry as it is, with one warning per content.
func (h *Hub) reloadEdgeKeys() {
	data, err := os.ReadFile(filepath.Clean(h.cfg.EdgeKeysFile))
	if err != nil {
		if h.keysSum != ([32]byte{}) {
			h.log.Warn("edge keys file unreadable; keeping the enrolled keys", "file", h.cfg.EdgeKeysFile, "err", err)
			h.keysSum = [32]byte{}
		}
		return
	}
	sum := sha256.Sum256(data)
	if sum == h.keysSum {
		return
	}
	h.keysSum = sum
	keys, err := parseEdgeKeys(h.cfg.EdgeKeysFile, data)
	if err != nil {
		h.log.Warn("edge keys file invalid; keeping the enrolled keys", "err", err)
		return
	}
	h.applyEdgeKeys(keys)
}

// applyEdgeKeys makes the file-enrolled edges exactly keys. Edges enrolled
// otherwise (AddEdge at runtime) are left alone.
func (h *Hub) applyEdgeKeys(keys map[string]string) {
	for _, node := range slices.Sorted(maps.Keys(keys)) {
		if h.fileKeys[node] == keys[node] {
			continue
		}
		if err := h.ids.AddEdge(node, keys[node]); err != nil {
			h.log.Warn("edge keys file: entry not enrolled", "file", h.cfg.EdgeKeysFile, "edge", node, "err", err)
			continue
		}
		if _, ok := h.fileKeys[node]; ok {
			h.log.Info("edge re-keyed from the edge keys file", "edge", node)
		} else if h.fileKeys != nil {
			h.log.Info("edge enrolled from the edge keys file", "edge", node)
		}
	}
	for node := range h.fileKeys {
		if _, ok := keys[node]; !ok {
			h.ids.RemoveEdge(node)
			h.log.Info("edge removed from the edge keys file; revoking it", "edge", node)
		}
	}
	h.fileKeys = keys
}
