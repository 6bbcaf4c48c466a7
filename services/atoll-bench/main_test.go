package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/atoll-edge/atoll/internal/cliflags"
)

// TestCommandLine: -h prints the usage and exits 0; a wrong flag is one
// line and a usage hint, exit 2 (no installation is started for either).
func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-h"}, 0, ""},
		{[]string{"--bogus"}, 2, "atoll-bench: flag provided but not defined: -bogus\nRun 'atoll-bench -h' for usage.\n"},
		{[]string{"--unit=2"}, 2, "atoll-bench: --unit 2: want at least 3\nRun 'atoll-bench -h' for usage.\n"},
	}
	for _, tt := range tests {
		var out, errs bytes.Buffer
		code := cliflags.Exit(&errs, "atoll-bench", run(context.Background(), tt.args, &out, io.Discard))
		if code != tt.code || errs.String() != tt.want {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", tt.args, code, errs.String(), tt.code, tt.want)
		}
		if tt.code == 0 && !strings.HasPrefix(out.String(), "usage: atoll-bench") {
			t.Errorf("%v: stdout %q", tt.args, out.String())
		}
	}
}
