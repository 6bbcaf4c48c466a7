package console_test

import (
	"flag"
	"io"
	"log/slog"
	"testing"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/console"
	"github.com/atoll-edge/atoll/cloud/views/members"
)

// TestModuleInCloudApp: atoll-cloud's graph with the kubernetes
// membership source provides everything the console needs, the members
// service (the agents' refused probe credentials) included, with the
// page on or off; the module alone does not validate.
func TestModuleInCloudApp(t *testing.T) {
	for _, on := range []bool{true, false} {
		cfg := cloudapp.Default()
		cfg.Members.Source = members.SourceKubernetes
		cfg.Console.Enabled = on
		if err := fx.ValidateApp(cloudapp.Options(cfg, slog.New(slog.DiscardHandler)), fx.Populate(new(*console.Console), new(*members.Service))); err != nil {
			t.Fatalf("console %v: %v", on, err)
		}
	}
	if err := fx.ValidateApp(console.Module); err == nil {
		t.Fatal("console.Module validated without its dependencies")
	}
}

// TestFlag: --console defaults to on and --console=false turns it off.
func TestFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--console=false"}, false}} {
		cfg := cloudapp.Default()
		fs := flag.NewFlagSet("atoll-cloud", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.RegisterFlags(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		if cfg.Console.Enabled != tt.want {
			t.Fatalf("%v: console %v, want %v", tt.args, cfg.Console.Enabled, tt.want)
		}
	}
}
