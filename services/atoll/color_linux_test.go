//go:build linux

package main

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal and returns its terminal end.
func openPTY(t *testing.T) *os.File {
	t.Helper()
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { ptmx.Close() })
	fd := int(ptmx.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlock pty: %v", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("pty number: %v", err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("open pty: %v", err)
	}
	t.Cleanup(func() { tty.Close() })
	return tty
}

// TestColorOnTerminal: --color=auto colours on a terminal unless
// $NO_COLOR is set, and never on a pipe or a regular file.
func TestColorOnTerminal(t *testing.T) {
	tty := openPTY(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(t.TempDir() + "/out")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for _, tt := range []struct {
		name    string
		out     *os.File
		noColor string
		want    bool
	}{
		{"terminal", tty, "", true},
		{"terminal, NO_COLOR", tty, "1", false},
		{"pipe", w, "", false},
		{"file", file, "", false},
	} {
		t.Setenv("NO_COLOR", tt.noColor)
		if got := colorFlag("auto").painter(tt.out).on; got != tt.want {
			t.Errorf("%s: colour %v, want %v", tt.name, got, tt.want)
		}
	}
}
