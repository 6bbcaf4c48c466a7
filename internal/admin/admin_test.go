package admin

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	base := "http://" + s.Addr()

	if code, body := get(t, base+"/readyz"); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("readyz with no checks = %d %q", code, body)
	}
	broken := errors.New("hub unreachable")
	s.AddReadiness("bus", func(context.Context) error { return broken })
	s.AddLiveness("loop", func(context.Context) error { return nil })
	if code, body := get(t, base+"/readyz"); code != 503 || !strings.Contains(body, "[-] bus: hub unreachable") {
		t.Fatalf("readyz with a failing check = %d %q", code, body)
	}
	if code, body := get(t, base+"/healthz"); code != 200 || !strings.Contains(body, "[+] loop ok") {
		t.Fatalf("healthz = %d %q", code, body)
	}
	broken = nil
	if code, _ := get(t, base+"/readyz"); code != 200 {
		t.Fatalf("readyz after recovery = %d", code)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("metrics = %d", code)
	}
}

func TestBadAddr(t *testing.T) {
	if _, err := New(Config{Addr: "nope"}, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "admin: addr") {
		t.Fatalf("err = %v", err)
	}
}

// TestHandle: a handler mounted with Handle is served on the listener
// beside the built-in endpoints.
func TestHandle(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("page " + r.URL.Path))
	}))
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	if code, body := get(t, "http://"+s.Addr()+"/ui/x"); code != http.StatusOK || body != "page /ui/x" {
		t.Fatalf("GET /ui/x: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+s.Addr()+"/healthz"); code != http.StatusOK {
		t.Fatalf("GET /healthz: %d", code)
	}
}
