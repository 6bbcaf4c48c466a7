// Package gobuild builds the repository's programs for tests that run
// them as deployed, in processes of their own.
package gobuild

import (
	"context"
	"fmt"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
)

var (
	mu     sync.Mutex
	builds = map[string]*build{}
)

type build struct {
	once sync.Once
	bin  string
	err  error
}

// Binary builds the program of pkg (a directory of the repository, such
// as "services/atoll-edge") into <repo>/bin/test once per test binary, and
// returns its path; go build relinks only what changed.
func Binary(ctx context.Context, pkg string) (string, error) {
	mu.Lock()
	b := builds[pkg]
	if b == nil {
		b = &build{}
		builds[pkg] = b
	}
	mu.Unlock()
	b.once.Do(func() {
		out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
		if err != nil {
			b.err = fmt.Errorf("gobuild: find the module: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		bin := filepath.Join(root, "bin", "test", path.Base(pkg))
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./"+pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("gobuild: build %s: %w: %s", pkg, err, out)
			return
		}
		b.bin = bin
	})
	return b.bin, b.err
}
