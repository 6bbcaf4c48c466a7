package e2e

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"

	"github.com/atoll-edge/atoll/docs"
	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/localapi"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/testbed"
)

// registered is a metric as a service registered it.
type registered struct {
	labels  []string
	service string
}

var (
	descRE     = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{(.*)\}, variableLabels: \{([^}]*)\}\}$`)
	constLabel = regexp.MustCompile(`(?:^|,)([a-zA-Z_][a-zA-Z0-9_]*)="`)
)

// atollMetrics reads the atoll_* metrics registered on an admin server's
// registry: the descriptors of everything registered (vectors without
// series included), and the families a scrape gathers (collectors that
// describe nothing).
func atollMetrics(t *testing.T, adm *admin.Server, service string, into map[string][]registered) {
	t.Helper()
	seen := map[string]bool{}
	defer func() { t.Logf("%s: %d atoll_* metrics", service, len(seen)) }()
	add := func(name string, labels []string) {
		if !strings.HasPrefix(name, "atoll_") || seen[name] {
			return
		}
		seen[name] = true
		slices.Sort(labels)
		into[name] = append(into[name], registered{labels: labels, service: service})
	}
	for _, d := range adm.Descriptors() {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read descriptor %s", d)
		}
		var labels []string
		for _, c := range constLabel.FindAllStringSubmatch(m[2], -1) {
			labels = append(labels, c[1])
		}
		if m[3] != "" {
			labels = append(labels, strings.Split(m[3], ",")...)
		}
		add(m[1], labels)
	}
	families, err := adm.Registry().Gather()
	if err != nil {
		t.Fatalf("%s: gather: %v", service, err)
	}
	for _, f := range families {
		var labels []string
		if len(f.GetMetric()) > 0 {
			for _, l := range f.GetMetric()[0].GetLabel() {
				labels = append(labels, l.GetName())
			}
		}
		add(f.GetName(), labels)
	}
}

// edgeAdmin starts atoll-edge with every optional component on (proxy,
// hosts file) and returns its admin server; no hub is needed for the
// registrations.
func edgeAdmin(t *testing.T) *admin.Server {
	acc, _ := nkeys.CreateAccount()
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	tok, err := jwt.NewUserClaims(pub).Encode(acc)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	creds, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile := filepath.Join(t.TempDir(), "node.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NODE_NAME", "edge-1")
	cfg := edgeapp.Default()
	fs := flag.NewFlagSet("atoll-edge", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--admin-addr=127.0.0.1:0", "--hub-url=nats-leaf://127.0.0.1:1", "--creds-file=" + credsFile,
		"--client-port=-1", "--route-host=127.0.0.1", "--route-port=-1", "--state-dir=" + t.TempDir(), "--unit=u1",
		"--proxy-addr=127.0.0.1:0", "--hosts-file=" + filepath.Join(t.TempDir(), "atoll.hosts")}); err != nil {
		t.Fatal(err)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var adm *admin.Server
	app := fxtest.New(t, edgeapp.Options(cfg, natstest.Logger(t, slog.LevelError)), fx.Populate(&adm))
	app.RequireStart()
	t.Cleanup(app.RequireStop)
	return adm
}

// localAPIAdmin starts `atoll-edge local-api`'s endpoint on an admin
// server (kube-apiserver need not answer for the registrations) and
// returns the admin server.
func localAPIAdmin(t *testing.T) *admin.Server {
	creds := natstest.NewTLS(t, t.TempDir(), "node") // any loadable key pair
	cfg := localapi.Default()
	cfg.Listen, cfg.APIServer, cfg.Dir = "127.0.0.1:0", "https://127.0.0.1:1", t.TempDir()
	cfg.CertFile, cfg.KeyFile = creds.CertFile, creds.KeyFile
	adm, err := admin.New(admin.Config{Addr: "127.0.0.1:0"}, natstest.Logger(t, slog.LevelError))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := localapi.New(cfg, adm.Registerer(), natstest.Logger(t, slog.LevelError)); err != nil {
		t.Fatal(err)
	}
	return adm
}

// TestMetricsTable: docs/reference/metrics.md lists exactly the atoll_* metrics
// that atoll-cloud (Kubernetes membership, grid controllers, object views
// and host records on, as deploy/ runs it), atoll-edge (proxy and hosts
// file on) and `atoll-edge local-api` register, with their labels and
// services.
func TestMetricsTable(t *testing.T) {
	table, err := docs.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]registered{}
	atollMetrics(t, edgeAdmin(t), "atoll-edge", got)
	atollMetrics(t, localAPIAdmin(t), "atoll-edge local-api", got)

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	bed, err := testbed.Start(ctx, testbed.Options{Dir: t.TempDir(), Grids: true, Logger: natstest.Logger(t, slog.LevelError)})
	if err != nil {
		t.Fatal(err)
	}
	defer bed.Stop()
	atollMetrics(t, bed.Admin, "atoll-cloud", got)
	if len(got) < 50 {
		t.Fatalf("only %d atoll_* metrics registered: the recording is broken", len(got))
	}

	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for n := range got {
			if !yield(n) {
				return
			}
		}
	}) {
		regs := got[name]
		row, ok := table[name]
		if !ok {
			t.Errorf("%s (%s, labels %v) is registered but missing from docs/reference/metrics.md", name, regs[0].service, regs[0].labels)
			continue
		}
		var services []string
		for _, r := range regs {
			services = append(services, r.service)
			labels := slices.Sorted(slices.Values(row.Labels))
			if !slices.Equal(labels, r.labels) && (len(labels) != 0 || len(r.labels) != 0) {
				t.Errorf("%s: docs/reference/metrics.md lists labels %v, %s registers %v", name, row.Labels, r.service, r.labels)
			}
		}
		slices.Sort(services)
		if want := slices.Sorted(slices.Values(row.Services)); !slices.Equal(want, services) {
			t.Errorf("%s: docs/reference/metrics.md says services %v, registered by %v", name, row.Services, services)
		}
	}
	for name := range table {
		if _, ok := got[name]; !ok {
			t.Errorf("docs/reference/metrics.md lists %s, which no service registers", name)
		}
	}
}
