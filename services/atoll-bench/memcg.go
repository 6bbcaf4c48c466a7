package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/atoll-edge/atoll/internal/memlimit"
)

// memoryCgroup is a memory cgroup of its own for atoll-cloud, limited as
// a pod's limits.memory limits its container: the kernel enforces the
// limit, and atoll-cloud reads it (internal/memlimit) as it does in a
// pod.
type memoryCgroup struct {
	dir   string // empty: no cgroup (GOMEMLIMIT set instead)
	limit int64
}

// newMemoryCgroup makes a cgroup limited to limit bytes (v2 or v1's
// memory hierarchy). Without the rights to make one, it returns a
// memoryCgroup that gives the process GOMEMLIMIT only, and says so in
// how.
func newMemoryCgroup(limit int64) (*memoryCgroup, error) {
	if limit <= 0 {
		return &memoryCgroup{}, nil
	}
	dir, file := "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir, file = "/sys/fs/cgroup", "memory.max"
	}
	cg, err := os.MkdirTemp(dir, "atoll-bench-")
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrNotExist) {
		return &memoryCgroup{limit: limit}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(cg, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		_ = os.Remove(cg)
		return nil, fmt.Errorf("memory cgroup %s: %w", cg, err)
	}
	return &memoryCgroup{dir: cg, limit: limit}, nil
}

// how says how the limit is enforced, for the run's environment line.
func (m *memoryCgroup) how() string {
	switch {
	case m.limit <= 0:
		return "atoll-cloud without a memory limit"
	case m.dir == "":
		return fmt.Sprintf("atoll-cloud with GOMEMLIMIT %d MiB only (no rights to make a memory cgroup of %d MiB)", int64(float64(m.limit)*memlimit.Ratio)>>20, m.limit>>20)
	}
	return fmt.Sprintf("atoll-cloud in a memory cgroup of %d MiB (GOMEMLIMIT %.0f %% of it, as in a pod)", m.limit>>20, 100*memlimit.Ratio)
}

// command is name with args run inside the cgroup: a shell joins it and
// becomes the program, so the limit holds before the program reads it
// (its pid is the shell's).
func (m *memoryCgroup) command(cmd *exec.Cmd) {
	switch {
	case m.limit <= 0:
	case m.dir == "":
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOMEMLIMIT=%d", int64(float64(m.limit)*memlimit.Ratio)))
	default:
		args := append([]string{"sh", "-c", `echo $$ > "$1" && shift && exec "$@"`, "sh", filepath.Join(m.dir, "cgroup.procs"), cmd.Path}, cmd.Args[1:]...)
		cmd.Path, cmd.Args = "/bin/sh", args
	}
}

// ooms is the cgroup's account of the kernel's OOM kills in it (v2's
// memory.events, v1's memory.oom_control).
func (m *memoryCgroup) ooms() string {
	if m.dir == "" {
		return ""
	}
	for _, f := range []string{"memory.events", "memory.oom_control"} {
		if b, err := os.ReadFile(filepath.Join(m.dir, f)); err == nil {
			return f + ": " + strings.Join(strings.Fields(string(b)), " ")
		}
	}
	return ""
}

// remove deletes the cgroup (its process gone).
func (m *memoryCgroup) remove() {
	if m.dir != "" {
		_ = os.Remove(m.dir)
	}
}
