package hubtls

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"time"
)

// Reloader keeps an external hub server serving the generated leaf
// certificate: nats-server reads its TLS files only at start and on
// SIGHUP, and the kubelet replaces the files of a mounted Secret when
// atoll-cloud rotates it. Run beside nats-server in its pod (`atoll-cloud
// hub-leaf-reloader`, a container sharing the pod's process namespace and
// user), it signals the server whenever the pair changes.
type Reloader struct {
	// CertFile and KeyFile are the server's leaf certificate and key.
	CertFile, KeyFile string
	// PIDFile is the server's pid_file.
	PIDFile string
	// Interval is how often the files are read.
	Interval time.Duration
	Log      *slog.Logger
}

// Validate names the first bad field.
func (r Reloader) Validate() error {
	switch {
	case r.CertFile == "" || r.KeyFile == "":
		return errors.New("hub leaf reloader: needs the certificate and key files")
	case r.PIDFile == "":
		return errors.New("hub leaf reloader: needs the server's pid file")
	case r.Interval <= 0:
		return fmt.Errorf("hub leaf reloader: interval %s: want more than 0", r.Interval)
	}
	return nil
}

// Run signals the server after each change of the pair until ctx ends. The
// first pair it sees is signalled too, when the server already runs: the
// reloader may have restarted after a rotation. A half-written or
// mismatched pair is skipped (the kubelet swaps both files at once; the
// next read sees both).
func (r Reloader) Run(ctx context.Context) error {
	if err := r.Validate(); err != nil {
		return err
	}
	var last []byte
	var lastErr string
	t := time.NewTicker(r.Interval)
	defer t.Stop()
	for {
		sum, err := r.pair()
		switch {
		case err != nil:
			if err.Error() != lastErr {
				r.Log.Warn("hub leaf reloader: the certificate does not load; the server keeps the one it has", "err", err)
			}
			lastErr = err.Error()
		case !bytes.Equal(sum, last):
			lastErr = ""
			pid, err := r.signal()
			switch {
			case errors.Is(err, os.ErrNotExist):
				// Not started yet: it reads the files when it starts.
				last = sum
			case err != nil:
				r.Log.Warn("hub leaf reloader: cannot signal the server; retrying", "err", err)
			default:
				r.Log.Info("hub leaf certificate changed: server reloaded", "pid", pid, "cert", r.CertFile)
				last = sum
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// pair is the digest of a certificate and key that load together.
func (r Reloader) pair() ([]byte, error) {
	cert, err := os.ReadFile(r.CertFile)
	if err != nil {
		return nil, err
	}
	key, err := os.ReadFile(r.KeyFile)
	if err != nil {
		return nil, err
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return nil, fmt.Errorf("%s and %s: %w", r.CertFile, r.KeyFile, err)
	}
	h := sha256.New()
	h.Write(cert)
	h.Write(key)
	return h.Sum(nil), nil
}

// signal sends SIGHUP to the process of the pid file.
func (r Reloader) signal() (int, error) {
	b, err := os.ReadFile(r.PIDFile)
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid file %s: %q is no process id", r.PIDFile, b)
	}
	if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
		return pid, fmt.Errorf("SIGHUP to %d (pid file %s): %w", pid, r.PIDFile, err)
	}
	return pid, nil
}
