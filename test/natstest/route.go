package natstest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/edge/natsnode"
)

// ErrRouteRefused is a route connection refused for its credentials.
var ErrRouteRefused = errors.New("route refused: authorization violation")

// RouteConnect opens a route connection to n's route listener with user
// and password, as a server of cluster would, and reports whether n
// accepts it (nil: it answered PING; ErrRouteRefused: bad credentials).
func RouteConnect(t testing.TB, n *natsnode.Node, cluster, user, password string) error {
	t.Helper()
	u, err := url.Parse(n.RouteURL())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("route listener of %s greeted with %q (%v)", n.Name(), line, err)
	}
	connect := fmt.Sprintf(`CONNECT {"verbose":false,"pedantic":false,"user":%q,"pass":%q,"tls_required":false,"name":"intruder-%d","cluster":%q,"headers":true}`+"\r\nPING\r\n",
		user, password, time.Now().UnixNano(), cluster)
	if _, err := conn.Write([]byte(connect)); err != nil {
		t.Fatal(err)
	}
	for {
		line, err := r.ReadString('\n')
		switch {
		case err != nil:
			return fmt.Errorf("route closed without an answer: %w", err)
		case strings.Contains(line, "Authorization Violation"):
			return ErrRouteRefused
		case strings.HasPrefix(line, "-ERR"):
			return errors.New(strings.TrimSpace(line))
		case strings.HasPrefix(line, "PONG"):
			return nil
		}
	}
}
