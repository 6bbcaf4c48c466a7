package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// hubFlags are the flags of the commands that talk to the hub.
type hubFlags struct {
	server, creds string
}

func (h *hubFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.server, "server", envOr("ATOLL_NATS_URL", nats.DefaultURL), "hub URL ($ATOLL_NATS_URL)")
	fs.StringVar(&h.creds, "creds", os.Getenv("ATOLL_NATS_CREDS"), "operator's NATS credentials file, issued with atoll-cloud's identity keys ($ATOLL_NATS_CREDS)")
}

// connect opens a connection to the hub as the operator, named name.
func (h *hubFlags) connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name(name)}, opts...)
	if h.creds != "" {
		opts = append(opts, nats.UserCredentials(h.creds))
	}
	nc, err := nats.Connect(h.server, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", h.server, err)
	}
	return nc, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
