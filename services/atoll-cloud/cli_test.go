package main

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/cliflags"
)

// cli runs atoll-cloud's command line as main does and returns its exit
// code, stdout and stderr.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errs bytes.Buffer
	err := run(ctx, args, &out, &errs)
	code = cliflags.Exit(&errs, prog, err)
	return code, out.String(), errs.String()
}

// TestCommandLineErrors: every wrong command line is one line naming what
// is wrong plus a usage hint, exit code 2; a failed start is one line
// (after the app's own log), exit code 1; nothing dumps fx's graph.
func TestCommandLineErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	base := []string{"--admin-addr=127.0.0.1:0", "--hub-host=127.0.0.1", "--hub-leaf-port=-1", "--hub-store-dir=" + t.TempDir()}
	tests := []struct {
		name string
		args []string
		code int
		want string // the first line of stderr; with code 1 its last, after the app's log
	}{
		{"unknown flag", []string{"--bogus"}, 2, "atoll-cloud: flag provided but not defined: -bogus"},
		{"bad value", []string{"--hub-client-port=abc"}, 2, `atoll-cloud: invalid value "abc" for flag -hub-client-port: parse error`},
		{"argument", []string{"start"}, 2, `atoll-cloud: unexpected argument "start" (atoll-cloud takes only flags)`},
		{"bad source", []string{"--membership-source=guess"}, 2, `atoll-cloud: members: source "guess": want kubernetes or declared`},
		{"no kubeconfig", append([]string{"--hub-client-port=-1", "--kubeconfig=/nonexistent"}, base...), 1,
			"atoll-cloud: kube: client config: stat /nonexistent: no such file or directory"},
		{"client port in use", append([]string{"--hub-client-port=" + busyPort, "--membership-source=declared"}, base...), 1,
			`atoll-cloud: start: hub: start atoll-hub-0: Error listening on port: 127.0.0.1:` + busyPort + `, "listen tcp 127.0.0.1:` + busyPort + `: bind: address already in use"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			code, stdout, stderr := cli(t, tt.args...)
			lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
			if code == 1 {
				if strings.Contains(stderr, "could not build") || strings.Contains(stderr, `"component":"fx"`) {
					t.Fatalf("fx's graph or events in the output:\n%s", stderr)
				}
				lines = lines[len(lines)-1:]
			}
			if code != tt.code || lines[0] != tt.want {
				t.Fatalf("exit %d, stderr:\n%s\nwant exit %d and the line\n%s", code, stderr, tt.code, tt.want)
			}
			if tt.code == 2 && (len(lines) != 2 || lines[1] != "Run 'atoll-cloud -h' for usage.") {
				t.Fatalf("want one line and a usage hint:\n%s", stderr)
			}
			if stdout != "" {
				t.Fatalf("stdout %q", stdout)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v to fail", d)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, arg := range []string{"-h", "--help"} {
		code, stdout, stderr := cli(t, arg)
		if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: atoll-cloud") || !strings.Contains(stdout, "-hub-url") {
			t.Fatalf("%s: exit %d, stdout %q, stderr %q", arg, code, stdout, stderr)
		}
	}
}
