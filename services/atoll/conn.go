package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats.go"
)

// hubFlags are the flags of the commands that talk to the hub.
type hubFlags struct {
	server, user, password string
}

func (h *hubFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&h.server, "server", envOr("ATOLL_NATS_URL", nats.DefaultURL), "hub URL ($ATOLL_NATS_URL)")
	fs.StringVar(&h.user, "user", os.Getenv("ATOLL_NATS_USER"), "operator user ($ATOLL_NATS_USER)")
	fs.StringVar(&h.password, "password", os.Getenv("ATOLL_NATS_PASSWORD"), "operator password ($ATOLL_NATS_PASSWORD)")
}

// connect opens a connection to the hub as the operator, named name.
func (h *hubFlags) connect(name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name(name)}, opts...)
	if h.user != "" {
		opts = append(opts, nats.UserInfo(h.user, h.password))
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
