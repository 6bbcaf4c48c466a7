package memlimit_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/atoll-edge/atoll/internal/memlimit"
)

// childEnv makes the test binary a child that prints the limit it set.
const childEnv = "ATOLL_MEMLIMIT_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		fmt.Println(memlimit.FromContainer(context.Background(), slog.New(slog.DiscardHandler)))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// inCgroup runs the test binary as a child in a memory cgroup (v1, as
// this machine has, or v2) limited to limit bytes, with env, and returns
// what it printed.
func inCgroup(t *testing.T, limit int64, env ...string) string {
	t.Helper()
	dir, file := "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir, file = "/sys/fs/cgroup", "memory.max"
	}
	cg, err := os.MkdirTemp(dir, "atoll-memlimit-test-")
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) {
		t.Skipf("cannot make a memory cgroup here (%v): needs root and a writable cgroup hierarchy", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })
	if err := os.WriteFile(filepath.Join(cg, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The shell joins the cgroup, then becomes the child: the limit is
	// there before the child reads it.
	cmd := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2"`, "sh", cg, os.Args[0])
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestFromTheContainersLimit: in a cgroup limited to 512 MiB the soft
// limit is 90 % of it.
func TestFromTheContainersLimit(t *testing.T) {
	var limit int64 = 512 << 20
	if got, want := inCgroup(t, limit), strconv.FormatInt(int64(float64(limit)*memlimit.Ratio), 10); got != want {
		t.Fatalf("GOMEMLIMIT in a container limited to 512 MiB = %s, want %s (90 %%)", got, want)
	}
}

// TestTheEnvironmentWins: GOMEMLIMIT in the environment is kept;
// AUTOMEMLIMIT=off, or a ratio outside (0, 1], leaves Go's default.
func TestTheEnvironmentWins(t *testing.T) {
	if got := inCgroup(t, 512<<20, "GOMEMLIMIT=100MiB"); got != strconv.Itoa(100<<20) {
		t.Fatalf("GOMEMLIMIT=100MiB in a container limited to 512 MiB gave %s, want %d", got, 100<<20)
	}
	if got := inCgroup(t, 512<<20, "AUTOMEMLIMIT=off"); got != "0" {
		t.Fatalf("AUTOMEMLIMIT=off gave %s, want 0 (the runtime's default)", got)
	}
	if got := inCgroup(t, 512<<20, "AUTOMEMLIMIT=2"); got != "0" {
		t.Fatalf("AUTOMEMLIMIT=2 (no fraction) gave %s, want 0 (the runtime's default, with a warning)", got)
	}
}
