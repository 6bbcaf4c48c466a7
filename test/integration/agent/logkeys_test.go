package agent_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nkeys"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/test/poll"
)

// syncBuffer is a bytes.Buffer safe for the app's concurrent loggers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// duplicateKey returns the first top-level key that appears twice in the
// JSON object line, or "".
func duplicateKey(line string) (string, error) {
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", fmt.Errorf("not a JSON object: %q", line)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return "", err
		}
		key := tok.(string)
		if seen[key] {
			return key, nil
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", nil
}

// TestLogLinesNameEachKeyOnce: every JSON line a started agent logs (its
// server, membership, reporter, prober, voter, admin and fx) holds each key
// once; in particular "node", which the app adds in one place.
func TestLogLinesNameEachKeyOnce(t *testing.T) {
	h, _ := cloud(t)
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	userJWT, err := h.IssueEdge("a", "u1", pub)
	if err != nil {
		t.Fatal(err)
	}
	cfg := edgeapp.Default()
	cfg.Admin.Addr = "127.0.0.1:0"
	cfg.NATS.NodeName = "a"
	cfg.NATS.Seed, cfg.NATS.UserJWT = string(seed), userJWT
	cfg.NATS.HubURLs = []string{h.LeafURL().String()}
	cfg.NATS.ClientPort, cfg.NATS.RoutePort = -1, -1
	cfg.NATS.RouteHost = "127.0.0.1"
	cfg.Reporter.Unit = "u1"
	cfg.Reporter.InternalIP = "127.0.0.1"
	cfg.Reporter.Period = 200 * time.Millisecond
	cfg.Membership.StateDir = t.TempDir()
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	app := fxtest.New(t, edgeapp.Options(cfg, log))
	app.RequireStart()
	poll.Eventually(t, 15*time.Second, func() error {
		for _, want := range []string{`"component":"natsnode"`, `"component":"membership"`, `"component":"admin"`} {
			if !strings.Contains(out.String(), want) {
				return fmt.Errorf("no line with %s yet", want)
			}
		}
		return nil
	})
	app.RequireStop()
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	lines := 0
	for sc.Scan() {
		lines++
		key, err := duplicateKey(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		if key != "" {
			t.Fatalf("key %q twice in %s", key, sc.Text())
		}
		if !strings.Contains(sc.Text(), `"node":"a"`) {
			t.Fatalf("line without the node: %s", sc.Text())
		}
	}
	if lines < 10 {
		t.Fatalf("only %d log lines", lines)
	}
}
