package cliflags

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
)

func TestParseAndExit(t *testing.T) {
	tests := []struct {
		args   []string
		code   int
		stderr string
	}{
		{nil, 0, ""},
		{[]string{"-h"}, 0, ""},
		{[]string{"--help"}, 0, ""},
		{[]string{"--nope"}, 2, "prog: flag provided but not defined: -nope\nRun 'prog sub -h' for usage.\n"},
		{[]string{"--port=x"}, 2, "prog: invalid value \"x\" for flag -port: parse error\nRun 'prog sub -h' for usage.\n"},
	}
	for _, tt := range tests {
		fs := flag.NewFlagSet("prog sub", flag.ContinueOnError)
		fs.Int("port", 1, "a port")
		var errs bytes.Buffer
		if code := Exit(&errs, "prog", Parse(fs, tt.args)); code != tt.code || errs.String() != tt.stderr {
			t.Errorf("%v: exit %d, stderr %q; want %d, %q", tt.args, code, errs.String(), tt.code, tt.stderr)
		}
	}
	var errs bytes.Buffer
	if code := Exit(&errs, "prog", fmt.Errorf("status: %w", ExitCode{Code: 4})); code != 4 || errs.String() != "" {
		t.Fatalf("ExitCode: exit %d, stderr %q", code, errs.String())
	}
	if code := Exit(&errs, "prog", errors.New("kube: no config")); code != 1 || errs.String() != "prog: kube: no config\n" {
		t.Errorf("runtime error: exit %d, %q", code, errs.String())
	}
	if code := Exit(&errs, "prog", Usagef("--units %d: want 1..20", 0)); code != 2 || !strings.Contains(errs.String(), "Run 'prog -h' for usage.") {
		t.Errorf("usage error: exit %d, %q", code, errs.String())
	}
}

func TestPrintUsage(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var out bytes.Buffer
	PrintUsage(&out, fs, "x")
	if out.String() != "usage: x\n" {
		t.Fatalf("no flags: %q", out.String())
	}
	fs.Bool("json", false, "print JSON")
	out.Reset()
	PrintUsage(&out, fs, "x [--json]")
	if !strings.HasPrefix(out.String(), "usage: x [--json]\n\nflags:\n  -json") {
		t.Fatalf("usage: %q", out.String())
	}
}
