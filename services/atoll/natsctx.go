package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// natsCLIContext is the part of the nats CLI's context file (one JSON
// object per context in ~/.config/nats/context/<name>.json, read by
// natscli through jsm.go's natscontext) that an Atoll operator needs.
type natsCLIContext struct {
	Description     string `json:"description"`
	URL             string `json:"url"`
	Creds           string `json:"creds,omitempty"`
	JetStreamDomain string `json:"jetstream_domain,omitempty"`
}

// natsContextDir is where the nats CLI keeps its contexts:
// $XDG_CONFIG_HOME/nats/context, else .config/nats/context in the user's
// home directory as the user database names it (the nats CLI does not
// read $HOME).
func natsContextDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats", "context"), nil
	}
	u, err := user.Current()
	if err != nil || u.HomeDir == "" {
		return "", fmt.Errorf("nats context: no home directory (%w): set XDG_CONFIG_HOME", err)
	}
	return filepath.Join(u.HomeDir, ".config", "nats", "context"), nil
}

// natsContext writes a nats CLI context for the hub that the hub flags
// name, after checking that they log in.
func natsContext(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll nats context", flag.ContinueOnError)
	var hf hubFlags
	hf.register(fs)
	name := fs.String("name", "atoll", "context name: the file <name>.json in the nats CLI's context directory")
	domain := fs.String("domain", hublink.DefaultDomain, "JetStream domain of the hub")
	check := fs.Bool("check", true, "log in to the hub first and fail if that does not work")
	if err := parseFlags(fs, args, stdout, "atoll nats context [--name N] [hub flags]   (writes $XDG_CONFIG_HOME/nats/context/N.json or ~/.config/nats/context/N.json)"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.UsageError{Err: fmt.Errorf("nats context: unexpected argument %q", fs.Arg(0)), Cmd: fs.Name()}
	}
	if *name == "" || filepath.Base(*name) != *name || *name == "." || *name == ".." {
		return cliflags.UsageError{Err: fmt.Errorf("nats context: --name %q must be a plain file name", *name), Cmd: fs.Name()}
	}
	if *check {
		nc, err := hf.connect("atoll nats context", nats.Timeout(3*time.Second), nats.MaxReconnects(0))
		if err != nil {
			return fmt.Errorf("nats context: %w (is the hub running? give --server, --creds or $ATOLL_NATS_*)", err)
		}
		nc.Close()
	}
	dir, err := natsContextDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("nats context: %w", err)
	}
	data, err := json.MarshalIndent(natsCLIContext{
		Description:     "Atoll hub (written by atoll nats context)",
		URL:             hf.server,
		Creds:           credsPath(hf.creds),
		JetStreamDomain: *domain,
	}, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, *name+".json")
	// The file names the credentials: owner only.
	if err := os.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("nats context: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s\nuse it with: nats --context %s sub 'atoll.>' --translate 'atoll decode --subject {{Subject}}'\n", path, *name)
	return nil
}

// credsPath is p made absolute: the nats CLI reads it from anywhere.
func credsPath(p string) string {
	if p == "" {
		return ""
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}
