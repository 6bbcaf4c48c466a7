package kubenode

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// fillFile is the file FillDisk fills the state disk with.
const fillFile = "kubenode-fill"

// FillDisk fills the node's state disk (/var/lib/atoll, a filesystem of
// its own with Config.StateDiskSize) until no byte is left, as a runaway
// log or a full partition would, and returns how many bytes it took.
// FreeDisk gives them back. Without a state disk of its own it refuses:
// it would fill the host's.
func (n *Node) FillDisk() (int64, error) {
	dir := n.HostPath(stateDir)
	if n.fleet.cfg.StateDiskSize == "" || !isMountPoint(dir) {
		return 0, fmt.Errorf("kubenode: %s has no state disk of its own (Config.StateDiskSize)", n.Name)
	}
	f, err := os.OpenFile(filepath.Join(dir, fillFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, fmt.Errorf("kubenode: %s: fill the state disk: %w", n.Name, err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	var total int64
	for {
		w, err := f.Write(chunk)
		total += int64(w)
		if errors.Is(err, syscall.ENOSPC) {
			// Whatever is left is smaller than a chunk: take it too.
			for len(chunk) > 1 {
				chunk = chunk[:len(chunk)/2]
				w, _ := f.Write(chunk)
				total += int64(w)
			}
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("kubenode: %s: fill the state disk: %w", n.Name, err)
		}
	}
}

// FreeDisk gives back what FillDisk took.
func (n *Node) FreeDisk() error {
	err := os.Remove(filepath.Join(n.HostPath(stateDir), fillFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}
