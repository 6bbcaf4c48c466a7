package tunnel

import (
	"fmt"
	"net"
	"strings"

	"github.com/atoll-edge/atoll/internal/tlsreload"
)

// TLS is the CONNECT listener's mutual TLS: the server certificate and
// key, and the CA bundle client certificates (kube-apiserver's
// tlsConfig.clientCert) must chain to. The files are re-read when one of
// them changes (a rotated, mounted Secret), checked at most once per
// second at a handshake; a bad rotation keeps the last good files.
type TLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// Enabled reports whether any file is set.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" || t.ClientCAFile != "" }

// The flags naming the TLS files, for errors an operator can act on.
const (
	flagCert     = "--tunnel-connect-tls-cert"
	flagKey      = "--tunnel-connect-tls-key"
	flagClientCA = "--tunnel-connect-client-ca"
	flagAddr     = "--tunnel-connect-addr"
)

// validate checks the combination; load checks the files.
func (t TLS) validate(addr string) error {
	if addr == "" {
		if t.Enabled() {
			return fmt.Errorf("tunnel: ConnectTLS (%s, %s, %s) set without ConnectAddr (%s)", flagCert, flagKey, flagClientCA, flagAddr)
		}
		return nil
	}
	switch {
	case t.CertFile == "" && t.KeyFile != "":
		return fmt.Errorf("tunnel: ConnectTLS.KeyFile (%s) set without ConnectTLS.CertFile (%s)", flagKey, flagCert)
	case t.CertFile != "" && t.KeyFile == "":
		return fmt.Errorf("tunnel: ConnectTLS.CertFile (%s) set without ConnectTLS.KeyFile (%s)", flagCert, flagKey)
	case t.ClientCAFile != "" && t.CertFile == "":
		return fmt.Errorf("tunnel: ConnectTLS.ClientCAFile (%s) set without a server certificate (%s, %s)", flagClientCA, flagCert, flagKey)
	}
	if strings.HasPrefix(addr, "unix:") {
		if t.Enabled() {
			return fmt.Errorf("tunnel: ConnectTLS (%s) is for a TCP ConnectAddr, not %q (a socket's file permissions guard it)", flagCert, addr)
		}
		return nil
	}
	if loopback(addr) {
		return nil
	}
	if t.CertFile == "" || t.ClientCAFile == "" {
		return fmt.Errorf("tunnel: ConnectAddr %q (%s) is reachable off this host: it needs mutual TLS (%s, %s and %s), or listen on loopback or unix:/path",
			addr, flagAddr, flagCert, flagKey, flagClientCA)
	}
	return nil
}

// loopback reports whether a host:port listens on loopback only.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// names name the CONNECT listener's TLS files in errors.
var names = tlsreload.Names{Component: "tunnel", Field: "ConnectTLS", CertFlag: flagCert, KeyFlag: flagKey, CAFlag: flagClientCA}
