// Package gobuild builds the repository's programs for tests that run
// them as deployed, in processes of their own.
package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
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

// Start runs bin with args in a process group of its own, its output in
// the file logPath, for t: the end of t kills the group with SIGKILL (so
// does the test binary's death), and a failed t logs the last 4 KiB of
// its output.
func Start(t testing.TB, logPath, bin string, args ...string) *exec.Cmd {
	t.Helper()
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("gobuild: start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			t.Logf("%s log (last 4 KiB):\n%s", filepath.Base(bin), out[max(0, len(out)-4096):])
		}
	})
	return cmd
}
