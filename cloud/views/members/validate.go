package members

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"

	"github.com/nats-io/nkeys"
)

// maxRouteURL bounds a route URL: nats-route://, a DNS name of at most 253
// bytes, a colon and a port fit well within it.
const maxRouteURL = 300

// Reasons a per-node input or a whole view is rejected (the reason label
// of atoll_members_views_rejected_total).
const (
	reasonRouteURL   = "route_url"
	reasonInternalIP = "internal_ip"
	reasonTooLarge   = "too_large"
	reasonPublish    = "publish_failed"
	reasonSecret     = "route_secret"
	reasonNodeKey    = "node_key"
)

// errRetry marks a failure worth retrying soon (a publish or a secret),
// unlike a rejected input, which waits for the input to change.
var errRetry = errors.New("will retry")

// checkRouteURL reports why u cannot be a unit peer's route URL, which
// edge servers require to be nats-route://host:port (edge/natsnode refuses a
// whole mesh over one bad peer URL, so the cloud never publishes one).
func checkRouteURL(u string) error {
	if len(u) > maxRouteURL {
		return fmt.Errorf("%d bytes, more than %d", len(u), maxRouteURL)
	}
	p, err := url.Parse(u)
	if err != nil {
		return errors.New("not a URL")
	}
	if p.Scheme != "nats-route" || p.User != nil || (p.Path != "" && p.Path != "/") || p.RawQuery != "" || p.Fragment != "" {
		return errors.New("not nats-route://host:port")
	}
	host, port, err := net.SplitHostPort(p.Host)
	if err != nil || host == "" {
		return errors.New("not nats-route://host:port")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q out of range", port)
	}
	return nil
}

// checkNodeKey reports why s is not an nkey user public key.
func checkNodeKey(s string) error {
	if !nkeys.IsValidPublicUserKey(s) {
		return errors.New("not an nkey user public key")
	}
	return nil
}

// checkIP reports why s is not an IP address.
func checkIP(s string) error {
	if _, err := netip.ParseAddr(s); err != nil {
		return errors.New("not an IP address")
	}
	return nil
}
