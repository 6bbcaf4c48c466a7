package prober

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// kubeletLike answers /healthz with a status set by the test, and 401 to
// a request whose bearer token is not the one it expects (when it
// expects one), as a kubelet with anonymous authentication off does.
type kubeletLike struct {
	mu     sync.Mutex
	status int
	token  string
}

func (k *kubeletLike) set(status int, token string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.status, k.token = status, token
}

func (k *kubeletLike) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	k.mu.Lock()
	status, token := k.status, k.token
	k.mu.Unlock()
	if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "Unauthorized", http.StatusUnauthorized)
		return
	}
	w.WriteHeader(status)
}

// TestHTTPAnswers: the kubelet check passes on 2xx, and on 401 or 403
// (the target is up and said no): silently without credentials (a
// kubelet with anonymous authentication off answers so), as Refused with
// a token. Any other status, or no answer, fails. A rotated token file is
// read again.
func TestHTTPAnswers(t *testing.T) {
	k := &kubeletLike{status: http.StatusOK}
	srv := httptest.NewTLSServer(k)
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	portN, _ := strconv.Atoi(port)
	target := Target{Name: "peer", IP: "127.0.0.1"}
	plugin := func(tokenFile string) Plugin {
		t.Helper()
		p, err := newHTTP(PluginConfig{Name: "kubelet-healthz", Port: portN, Scheme: "https", TokenFile: tokenFile, InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	check := func(p Plugin) error {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		return p.Check(ctx, target)
	}
	anonymous := plugin("")
	for _, c := range []struct {
		status int
		pass   bool
	}{{200, true}, {401, true}, {403, true}, {500, false}, {404, false}} {
		k.set(c.status, "")
		if err := check(anonymous); (err == nil) != c.pass {
			t.Errorf("no credentials, kubelet answers %d: %v, want pass=%v", c.status, err, c.pass)
		}
	}

	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte("first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	withToken := plugin(tokenPath)
	k.set(http.StatusOK, "first")
	if err := check(withToken); err != nil {
		t.Errorf("the token the kubelet expects: %v", err)
	}
	var refused *Refused
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		k.set(status, "")
		if err := check(withToken); !errors.As(err, &refused) {
			t.Errorf("a token, kubelet answers %d: %v, want Refused", status, err)
		}
	}
	// The kubelet now expects the rotated token; the file is rewritten
	// (a later modification time) and read again.
	k.set(http.StatusOK, "second")
	if err := check(withToken); !errors.As(err, &refused) {
		t.Errorf("the old token: %v, want Refused", err)
	}
	later := time.Now().Add(time.Second)
	if err := os.WriteFile(tokenPath, []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(tokenPath, later, later); err != nil {
		t.Fatal(err)
	}
	if err := check(withToken); err != nil {
		t.Errorf("the rotated token: %v", err)
	}

	srv.Close()
	if err := check(anonymous); err == nil {
		t.Error("a kubelet that does not answer passed")
	}
}

// TestRefusedCountsAsUp: a refused check adds its weight to the score,
// keeps its reason in the report and counts as "refused".
func TestRefusedCountsAsUp(t *testing.T) {
	p := &Prober{metrics: newMetrics(nil), refused: map[string]*atollv1.ProbeRefusal{}, log: slog.New(slog.DiscardHandler)}
	pl := plugin{Plugin: refusing{}, cfg: PluginConfig{Name: "kubelet-healthz", Weight: 0.5, Timeout: time.Second}}
	pr := p.runPlugin(t.Context(), pl, Target{Name: "peer"})
	if !pr.GetOk() || pr.GetScore() != 50 || pr.GetError() == "" {
		t.Errorf("refused check: ok %v score %v error %q, want ok, 50 and the reason", pr.GetOk(), pr.GetScore(), pr.GetError())
	}
}

// TestRefusals: the prober keeps each plugin's last refusal, sorted by
// plugin, until a check of that plugin against the refusing peer passes
// or that peer is no longer checked, and tells its watchers when a plugin
// becomes refused or stops being refused, not at every refusal.
func TestRefusals(t *testing.T) {
	p := &Prober{metrics: newMetrics(nil), refused: map[string]*atollv1.ProbeRefusal{}, log: slog.New(slog.DiscardHandler)}
	changes := p.RefusalChanges()
	healthz := &answering{}
	other := &answering{}
	run := func(a *answering, name, peer string, err error) {
		t.Helper()
		a.err = err
		p.runPlugin(t.Context(), plugin{Plugin: a, cfg: PluginConfig{Name: name, Weight: 0.5, Timeout: time.Second}}, Target{Name: peer})
	}
	changed := func() bool {
		select {
		case <-changes:
			return true
		default:
			return false
		}
	}
	want := func(step string, want ...*atollv1.ProbeRefusal) {
		t.Helper()
		got := p.Refusals()
		if len(got) != len(want) {
			t.Fatalf("%s: refusals %v, want %v", step, got, want)
		}
		for i := range got {
			if !proto.Equal(got[i], want[i]) {
				t.Fatalf("%s: refusals %v, want %v", step, got, want)
			}
		}
	}
	refusal := func(plugin, peer, status string) *atollv1.ProbeRefusal {
		return &atollv1.ProbeRefusal{Plugin: plugin, Peer: peer, Status: status}
	}

	run(healthz, "kubelet-healthz", "b", nil)
	want("passing")
	if changed() {
		t.Fatal("a passing check told the watchers of a change")
	}
	run(healthz, "kubelet-healthz", "b", &Refused{Status: "401 Unauthorized"})
	want("refused by b", refusal("kubelet-healthz", "b", "401 Unauthorized"))
	if !changed() {
		t.Fatal("a plugin newly refused did not tell the watchers")
	}
	run(healthz, "kubelet-healthz", "c", &Refused{Status: "403 Forbidden"})
	want("refused by c too", refusal("kubelet-healthz", "c", "403 Forbidden"))
	if changed() {
		t.Fatal("another refusal of a plugin already refused told the watchers")
	}
	run(other, "another-check", "b", &Refused{Status: "401 Unauthorized"})
	want("two plugins refused", refusal("another-check", "b", "401 Unauthorized"), refusal("kubelet-healthz", "c", "403 Forbidden"))
	if !changed() {
		t.Fatal("a second plugin refused did not tell the watchers")
	}
	run(healthz, "kubelet-healthz", "d", errors.New("connection refused"))
	want("a failed check keeps the refusal", refusal("another-check", "b", "401 Unauthorized"), refusal("kubelet-healthz", "c", "403 Forbidden"))
	if changed() {
		t.Fatal("a failed check told the watchers")
	}
	run(healthz, "kubelet-healthz", "b", nil)
	want("b accepts, c still refuses", refusal("another-check", "b", "401 Unauthorized"), refusal("kubelet-healthz", "c", "403 Forbidden"))
	if changed() {
		t.Fatal("a pass against a peer that did not refuse told the watchers")
	}
	run(healthz, "kubelet-healthz", "c", nil)
	want("kubelet-healthz passes at c", refusal("another-check", "b", "401 Unauthorized"))
	if !changed() {
		t.Fatal("a refused plugin passing did not tell the watchers")
	}
	got := p.Refusals()
	got[0].Peer = "mutated"
	want("the caller's copy", refusal("another-check", "b", "401 Unauthorized"))
	p.pruneRefused([]Target{{Name: "c"}, {Name: "d"}})
	want("b left the unit")
	if !changed() {
		t.Fatal("a refusal dropped with its peer did not tell the watchers")
	}
}

// answering is a plugin that answers err.
type answering struct{ err error }

func (a *answering) Check(context.Context, Target) error { return a.err }

type refusing struct{}

func (refusing) Check(context.Context, Target) error { return &Refused{Status: "401 Unauthorized"} }
