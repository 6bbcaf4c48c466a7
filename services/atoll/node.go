package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/atoll-edge/atoll/cloud/identity"
	"github.com/atoll-edge/atoll/internal/cliflags"
)

// identityRequest sends req as JSON to an identity endpoint of atoll-cloud
// and decodes the reply into out.
func identityRequest(ctx context.Context, hf hubFlags, subject string, req, out any) error {
	nc, err := hf.connect("atoll node", nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return err
	}
	defer nc.Close()
	data, err := json.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("no atoll-cloud serves %s (is it running?)", subject)
		}
		return fmt.Errorf("request %s: %w", subject, err)
	}
	if desc := msg.Header.Get(micro.ErrorHeader); desc != "" {
		return fmt.Errorf("atoll-cloud refused: %s", desc)
	}
	return json.Unmarshal(msg.Data, out)
}

// nodeRevoke revokes a node's credentials.
func nodeRevoke(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll node revoke", flag.ContinueOnError)
	var hf hubFlags
	hf.register(fs)
	if err := parseFlags(fs, args, stdout, "atoll node revoke [hub flags] NODE"); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cliflags.UsageError{Err: errors.New("node revoke: give exactly one node name"), Cmd: fs.Name()}
	}
	var rec identity.Record
	if err := identityRequest(ctx, hf, identity.RevokeSubject, identity.RevokeRequest{Node: fs.Arg(0)}, &rec); err != nil {
		return fmt.Errorf("node revoke: %w", err)
	}
	_, err := fmt.Fprintf(stdout, "revoked %s (key %s): its hub link is closed and it cannot connect again\n", rec.Node, rec.Key)
	return err
}

// nodeEnroll asks atoll-cloud for a node's one-time bootstrap token and
// writes it to a file (or stdout).
func nodeEnroll(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll node enroll", flag.ContinueOnError)
	var hf hubFlags
	hf.register(fs)
	ttl := fs.Duration("ttl", time.Hour, "lifetime of the token")
	unit := fs.String("unit", "", "unit the node's credentials are scoped to")
	out := fs.String("out", "", "write the token to this file (0600) instead of stdout")
	if err := parseFlags(fs, args, stdout, "atoll node enroll [--ttl 1h] [--unit U] [--out FILE] [hub flags] NODE   (then: atoll-edge --bootstrap-token-file FILE)"); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return cliflags.UsageError{Err: errors.New("node enroll: give exactly one node name"), Cmd: fs.Name()}
	}
	var rep identity.TokenReply
	if err := identityRequest(ctx, hf, identity.TokenSubject, identity.TokenRequest{Node: fs.Arg(0), Unit: *unit, TTL: *ttl}, &rep); err != nil {
		return fmt.Errorf("node enroll: %w", err)
	}
	if *out == "" {
		_, err := io.WriteString(stdout, rep.Creds)
		return err
	}
	if err := os.WriteFile(*out, []byte(rep.Creds), 0o600); err != nil {
		return fmt.Errorf("node enroll: %w", err)
	}
	_, err := fmt.Fprintf(stdout, "wrote the bootstrap token of %s to %s (valid until %s, usable once)\n", rep.Node, *out, rep.Expires.Format(time.RFC3339))
	return err
}
