package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/poll"
)

// kubectlPath is the kubectl built from the pinned Kubernetes module
// (kubetest.Kubectl).
func kubectlPath(t *testing.T) string {
	t.Helper()
	path, err := kubetest.Kubectl()
	if err != nil {
		t.Fatal(err)
	}
	return path
}

func kubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: proxy, cluster: {server: %q}}]
users: [{name: anyone, user: {}}]
contexts: [{name: proxy, context: {cluster: proxy, user: anyone}}]
current-context: proxy
`, server)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// lines collects the output lines of a running command.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) has(s string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.all {
		if strings.Contains(x, s) {
			return nil
		}
	}
	return fmt.Errorf("no line with %q in %q", s, l.all)
}

func (l *lines) hasFields(want ...string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, x := range l.all {
		if slices.Equal(strings.Fields(x), want) {
			return nil
		}
	}
	return fmt.Errorf("no line %q in %q", want, l.all)
}

// TestKubectlWatch: `kubectl get endpointslices --watch` against the
// proxy lists the filtered slices and prints the changes as they come
// (`kubectl get` of nodes and services works too); a proxy restart ends
// it. `kubectl get --raw` of a watch then shows a resume from a held
// revision after the restart (only later changes, then bookmarks) and a
// 410 ERROR event for a revision a proxy that lost its state no longer
// holds.
func TestKubectlWatch(t *testing.T) {
	kubectl := kubectlPath(t)
	store := unitStore(t)
	api := newAPIServer(t, store)
	kc := kubeconfig(t, "http://"+api.addr)

	out, err := exec.Command(kubectl, "--kubeconfig", kc, "get", "nodes,services", "-A").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "a1") || !strings.Contains(string(out), "web") {
		t.Fatalf("kubectl get nodes,services: %v\n%s", err, out)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kc, "get", "endpointslices", "-A", "--watch",
		"-o", "custom-columns=NAME:.metadata.name,RV:.metadata.resourceVersion,NODES:.endpoints[*].nodeName")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := &lines{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			got.mu.Lock()
			got.all = append(got.all, sc.Text())
			got.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); _ = cmd.Wait(); <-done })

	// The list: web-1 with only the host's zone's endpoints.
	poll.Eventually(t, 20*time.Second, func() error { return got.has("web-1") })
	if err := got.has("a1,a2"); err != nil {
		t.Fatalf("listed slice not filtered: %v (stderr %s)", err, stderr.String())
	}
	if got.has("b1") == nil {
		t.Fatalf("b1's endpoint served to a host in zone A: %q", got.all)
	}
	// The watch: a new slice, then a change of it.
	feed(t, store, testSlice("web-2", "web", "b1"))
	poll.Eventually(t, 10*time.Second, func() error { return got.has("web-2") })
	feed(t, store, testSlice("web-2", "web", "a2", "b1"))
	poll.Eventually(t, 10*time.Second, func() error { return got.hasFields("web-2", fmt.Sprint(store.Rev()), "a2") })

	// A proxy restart ends kubectl's watch (kubectl get --watch does not
	// retry); what a client that resumes gets is shown with the raw
	// watch below.
	api.stop()
	poll.Eventually(t, 20*time.Second, func() error {
		select {
		case <-done:
			return nil
		default:
			return errors.New("kubectl still running")
		}
	})
	api.restart(store)

	// Resume from a held revision after the restart, with bookmarks:
	// only what changed after it (web-3), then bookmarks; no relist.
	from := store.Rev()
	feed(t, store, testSlice("web-3", "web", "a1"))
	raw := rawWatch(t, kubectl, kc, fmt.Sprintf("/apis/discovery.k8s.io/v1/endpointslices?watch=true&allowWatchBookmarks=true&resourceVersion=%d", from))
	poll.Eventually(t, 20*time.Second, func() error { return raw.has(`"BOOKMARK"`) })
	if err := raw.has(`"web-3"`); err != nil {
		t.Fatal(err)
	}
	if raw.has(`"web-1"`) == nil || raw.has(`"web-2"`) == nil {
		t.Fatalf("the resumed watch relisted: %q", raw.all)
	}

	// A revision the proxy no longer holds (its state was lost): 410 in
	// the watch, so the client relists.
	fresh := NewStore("a1", 100, nil)
	feed(t, fresh, testNode("a1", map[string]string{zone: "A"}))
	api.restart(fresh)
	gone := rawWatch(t, kubectl, kc, fmt.Sprintf("/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion=%d", store.Rev()))
	poll.Eventually(t, 20*time.Second, func() error { return gone.has(`"code":410`) })
	if err := gone.has(`"ERROR"`); err != nil {
		t.Fatal(err)
	}
}

// rawWatch runs kubectl get --raw on a watch URL and collects its output.
func rawWatch(t *testing.T, kubectl, kc, url string) *lines {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kc, "get", "--raw", url)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	got := &lines{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			got.mu.Lock()
			got.all = append(got.all, sc.Text())
			got.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; _ = cmd.Wait() })
	return got
}
