package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/test/natstest"
)

// cli runs atoll's command line as main does and returns its exit code,
// stdout and stderr.
func cli(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errs bytes.Buffer
	err := run(context.Background(), args, strings.NewReader(""), &out)
	code = cliflags.Exit(&errs, "atoll", err)
	return code, out.String(), errs.String()
}

// TestHelpExitsZero: -h and --help on every command and subcommand print
// its usage on stdout and exit 0.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"},
		{"decode", "-h"}, {"status", "-h"}, {"status", "--help"},
		{"events", "-h"}, {"events", "tail", "-h"}, {"events", "catalog", "-h"},
		{"nats", "-h"}, {"nats", "context", "-h"},
		{"grid", "-h"}, {"grid", "status", "-h"}, {"grid", "resume", "-h"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, stdout, stderr := cli(t, args...)
			if code != 0 || stderr != "" || !strings.HasPrefix(stdout, "usage: atoll") {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
		})
	}
}

// TestUsageErrors: a wrong command line is one line naming what is wrong
// and a hint to the command's -h, exit code 2.
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		args       []string
		want, hint string
	}{
		{nil, "atoll: no command given (decode, events tail, events catalog, nats context, node enroll, node revoke, status, grid status, grid resume)", "atoll"},
		{[]string{"grid"}, "atoll: grid: give a subcommand: [status resume]", "atoll grid"},
		{[]string{"grid", "resume"}, "atoll: grid resume: give exactly one grid name", "atoll grid resume"},
		{[]string{"grid", "status", "a", "b"}, "atoll: grid status: give exactly one grid name", "atoll grid status"},
		{[]string{"grid", "status", "-o", "wide", "web"}, `atoll: invalid value "wide" for flag -o: want one of json, yaml`, "atoll grid status"},
		{[]string{"stats"}, `atoll: unknown command "stats"`, "atoll"},
		{[]string{"status", "--bogus"}, "atoll: flag provided but not defined: -bogus", "atoll status"},
		{[]string{"status", "--timeout=soon"}, `atoll: invalid value "soon" for flag -timeout: parse error`, "atoll status"},
		{[]string{"status", "-o", "xml"}, `atoll: invalid value "xml" for flag -o: want one of wide, json, yaml`, "atoll status"},
		{[]string{"status", "--output=table"}, `atoll: invalid value "table" for flag -output: want one of wide, json, yaml`, "atoll status"},
		{[]string{"status", "--color=rainbow"}, `atoll: invalid value "rainbow" for flag -color: want auto, always or never`, "atoll status"},
		{[]string{"status", "--timeout=0s"}, "atoll: status: --timeout 0s must be positive", "atoll"},
		{[]string{"events"}, "atoll: events: give a subcommand: [tail catalog]", "atoll events"},
		{[]string{"events", "nope"}, `atoll: events: unknown subcommand "nope" (want one of [tail catalog])`, "atoll events"},
		{[]string{"events", "catalog", "extra"}, `atoll: events catalog: unexpected argument "extra"`, "atoll events catalog"},
		{[]string{"decode"}, "atoll: decode: give --type or --subject", "atoll"},
		{[]string{"node", "revoke"}, "atoll: node revoke: give exactly one node name", "atoll node revoke"},
		{[]string{"node", "enroll", "a", "b"}, "atoll: node enroll: give exactly one node name", "atoll node enroll"},
		{[]string{"nats", "context", "--name=../x"}, `atoll: nats context: --name "../x" must be a plain file name`, "atoll nats context"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, stdout, stderr := cli(t, tt.args...)
			want := tt.want + "\nRun '" + tt.hint + " -h' for usage.\n"
			if code != 2 || stderr != want || stdout != "" {
				t.Fatalf("exit %d, stdout %q, stderr\n%s\nwant exit 2, stderr\n%s", code, stdout, stderr, want)
			}
		})
	}
}

// TestNatsContext: atoll nats context checks the login and writes a nats
// CLI context (owner-only) that names the hub, the
// operator and the JetStream domain.
func TestNatsContext(t *testing.T) {
	h := natstest.Hub(t)
	cfg := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfg)
	t.Setenv("ATOLL_NATS_URL", h.ClientURL())

	t.Setenv("ATOLL_NATS_CREDS", natstest.OperatorCreds(t, natstest.Hub(t).Issuer()))
	if code, _, stderr := cli(t, "nats", "context"); code != 1 || !strings.Contains(stderr, "is the hub running?") {
		t.Fatalf("foreign credentials: exit %d, %s", code, stderr)
	}
	path := filepath.Join(cfg, "nats", "context", "demo.json")
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("wrote a context that cannot log in: %v", err)
	}

	creds := natstest.OperatorCreds(t, h.Issuer())
	t.Setenv("ATOLL_NATS_CREDS", creds)
	code, stdout, stderr := cli(t, "nats", "context", "--name", "demo")
	if code != 0 || !strings.Contains(stdout, "nats --context demo sub 'atoll.>' --translate 'atoll decode --subject {{Subject}}'") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("context file %v, mode %v", err, st)
	}
	data, _ := os.ReadFile(path)
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got["url"] != h.ClientURL() || got["creds"] != creds || got["jetstream_domain"] != "hub" {
		t.Fatalf("context %s", data)
	}
}
