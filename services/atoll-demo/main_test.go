package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/atoll-edge/atoll/test/natstest"
)

// lastTable returns the rows of the last status table printed.
func lastTable(out string) []string {
	i := strings.LastIndex(out, "UNIT ")
	if i < 0 {
		return nil
	}
	var rows []string
	for _, l := range strings.Split(out[i:], "\n")[1:] {
		if strings.HasPrefix(l, "site-") {
			rows = append(rows, l)
		} else {
			break
		}
	}
	return rows
}

// TestDemo runs the README's main command in small: two sites of two
// nodes come up Ready in Kubernetes, linked to the hub and meshed.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out natstest.Buffer
	dir := filepath.Join(t.TempDir(), "not", "yet")
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--units=2", "--nodes=2", "--interval=500ms", "--hub-port=0", "--cut-after=0", "--dir=" + dir}, &out)
	}()
	healthy := regexp.MustCompile(`^site-[ab]\s+site-[ab]-\d\s+True\s+-\s+healthy 1/0/0\s+Normal\s+-\s+ready\s+running\s+up\s+1\s+2\s*$`)
	poll.Eventually(t, 90*time.Second, func() error {
		select {
		case err := <-done:
			t.Fatalf("demo ended early: %v\n%s", err, out.String())
		default:
		}
		rows := lastTable(out.String())
		if len(rows) != 4 {
			return poll.Errorf("want 4 rows, have %q", rows)
		}
		for _, r := range rows {
			if !healthy.MatchString(r) {
				return poll.Errorf("row not healthy yet: %q", r)
			}
		}
		return nil
	})
	// The grid's copies: one per site, ready, two pods in site-b.
	copies := []*regexp.Regexp{
		regexp.MustCompile(`(?m)^site-a\s+hello-site-a\s+yes\s+1/1\s*$`),
		regexp.MustCompile(`(?m)^site-b\s+hello-site-b\s+yes\s+2/2\s*$`),
	}
	poll.Eventually(t, 60*time.Second, func() error {
		s := out.String()
		i := strings.LastIndex(s, "GRID demo/hello")
		if i < 0 {
			return poll.Errorf("no grid table yet")
		}
		for _, re := range copies {
			if !re.MatchString(s[i:]) {
				return poll.Errorf("grid table lacks %s: %q", re, s[i:])
			}
		}
		return nil
	})
	// Site-local traffic: each node's proxy serves only its own site's
	// endpoints of hello-svc (one in site-a, two in site-b).
	local := regexp.MustCompile(`^(site-[ab])-\d\s+(site-[ab])\s+(\d+)\s+(\S+)\s*$`)
	poll.Eventually(t, 90*time.Second, func() error {
		s := out.String()
		i := strings.LastIndex(s, "ENDPOINTS OF demo/hello-svc")
		if i < 0 {
			return poll.Errorf("no traffic table yet")
		}
		rows := 0
		for _, l := range strings.Split(s[i:], "\n")[2:] {
			if !strings.HasPrefix(l, "site-") {
				break
			}
			rows++
			m := local.FindStringSubmatch(l)
			if m == nil {
				return poll.Errorf("traffic row not served yet: %q", l)
			}
			want := map[string]int{"site-a": 1, "site-b": 2}[m[2]]
			eps := strings.Split(m[4], ",")
			if len(eps) != want || m[3] != fmt.Sprint(want) {
				return poll.Errorf("node of %s serves %q, want %d endpoints", m[2], m[4], want)
			}
			for _, e := range eps {
				if !strings.Contains(e, "@"+m[2]+"-") {
					return poll.Errorf("node of %s serves another site's endpoint %s", m[2], e)
				}
			}
		}
		if rows != 4 {
			return poll.Errorf("want 4 traffic rows, have %d", rows)
		}
		return nil
	})
	// The sites' agents share the hub's copies of the shared views, and
	// take what their peers relay (the cloud signed it).
	logText := func() string {
		b, err := os.ReadFile(filepath.Join(dir, "atoll-demo.log"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	poll.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(logText(), "following the views its agents relay") {
			return poll.Errorf("no agent follows the views its site relays")
		}
		return nil
	})
	if strings.Contains(logText(), "refused a view relayed") {
		t.Error("an agent refused a view its site relayed")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("demo did not stop")
	}
	checkKeptLogs(t, dir, out.String())
}

// checkKeptLogs: the demo said how to stop it, where its logs are, and
// kept them after it stopped.
func checkKeptLogs(t *testing.T, dir, out string) {
	t.Helper()
	logPath := filepath.Join(dir, "atoll-demo.log")
	for _, want := range []string{"logs in " + logPath, "press Ctrl-C to stop", "stopped; logs kept in " + logPath} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(logPath); err != nil {
		t.Errorf("log not kept: %v", err)
	}
}

// TestDemoInterruptedEarly: a demo interrupted before Kubernetes is up
// creates its missing --dir, stops without an error and keeps its log.
func TestDemoInterruptedEarly(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	dir := filepath.Join(t.TempDir(), "missing", "dir")
	var out strings.Builder
	if err := run(ctx, []string{"--dir=" + dir}, &out); err != nil {
		t.Fatalf("interrupted demo: %v\n%s", err, out.String())
	}
	checkKeptLogs(t, dir, out.String())
}

func TestDemoHelp(t *testing.T) {
	var out strings.Builder
	if _, err := parse([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "usage: atoll-demo") {
		t.Fatalf("-h: %v, %q", err, out.String())
	}
}

func TestDemoFlags(t *testing.T) {
	for _, args := range [][]string{{"--units=0"}, {"--nodes=100"}, {"--interval=0s"},
		{"--real-nodes", "--hub-cluster"}, {"--real-nodes", "--units=4", "--nodes=4"}} {
		if _, err := parse(args, io.Discard); err == nil {
			t.Errorf("parse(%v) accepted", args)
		}
	}
}

// TestDemoRealNodes runs `demo -- --real-nodes` in small (root): one site
// of two real nodes and Atoll as pods come up SAFE; site-a-1's link is cut
// and Atoll protects it while KCM has lost it; the grid's copy is ready;
// the status page's URL is printed; the demo stops cleanly with its
// --duration.
func TestDemoRealNodes(t *testing.T) {
	if err := kubenode.Prerequisites(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	var out natstest.Buffer
	err := run(t.Context(), []string{"--real-nodes", "--units=1", "--nodes=2", "--interval=2s", "--cut-after=5s",
		"--cut-for=5m", "--duration=40s", "--dir=" + dir}, &out)
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []*regexp.Regexp{
		regexp.MustCompile(`ready in .*: atoll-cloud and every atoll-edge Ready, every node enrolled by itself, atoll status SAFE`),
		regexp.MustCompile(`status page: +http://127\.0\.0\.1:\d+/ui/`),
		regexp.MustCompile(`(?m)^site-a\s+hello-site-a\s+yes\s+1/1\s*$`),
		regexp.MustCompile(`(?m)^site-a\s+site-a-1\s+Unknown\s+unreachable:NoSchedule\s`),
		regexp.MustCompile(`(?m)^site-a\s+SAFE\s+PartialDisruption\s.*protected: site-a-1`),
	} {
		if !want.MatchString(s) {
			t.Errorf("output lacks %s:\n%s", want, s)
		}
	}
	if strings.Contains(s, "unreachable:NoExecute") {
		t.Errorf("the cut node got the NoExecute taint:\n%s", s)
	}
	checkKeptLogs(t, dir, s)
}
