package main

import (
	"flag"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/internal/testenv/natstest"
)

func TestAppStartsAndStops(t *testing.T) {
	cfg := cloudapp.Default()
	fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	store := t.TempDir()
	t.Setenv("ATOLL_HUB_STORE_DIR", store)
	if err := fs.Parse([]string{"--admin-addr=127.0.0.1:0", "--hub-host=127.0.0.1", "--hub-client-port=-1", "--hub-leaf-port=-1", "--membership-source=declared"}); err != nil {
		t.Fatal(err)
	}
	if err := setup(fs, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Hub.StoreDir != store {
		t.Fatalf("store dir %q not taken from the environment", cfg.Hub.StoreDir)
	}
	fxtest.New(t, cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn))).RequireStart().RequireStop()
}

func TestBadConfigNamesTheField(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--hub-leaf-port=70000"}, "leaf port"},
		{[]string{"--stream-replicas=0"}, "stream replicas"},
		{[]string{"--admin-addr=nonsense"}, "admin: addr"},
		{[]string{"--operators-file=/nonexistent"}, "operators file"},
		{[]string{"--membership-source=guess"}, "source"},
		{[]string{"--webhook-cert-dir="}, "cert dir"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			cfg := cloudapp.Default()
			fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
			cfg.RegisterFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			err := setup(fs, &cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("setup(%v) = %v, want an error about %q", tt.args, err, tt.want)
			}
		})
	}
}
