// Package atomicfile replaces a file's content durably: a power cut
// leaves the old content or the new, never a part of it.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// TempPrefix starts the names of the temporary files Write makes beside
// its target; one left by a power cut can be removed.
const TempPrefix = ".tmp-"

// Write replaces path with data (mode perm): a temporary file in the same
// directory, written and synced, renamed over path, and the directory
// synced. The directory is created (0700) if missing.
func Write(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, TempPrefix+"*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
