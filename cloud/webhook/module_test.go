package webhook

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/test/poll"

	"go.uber.org/fx"
	"go.uber.org/fx/fxtest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/atoll-edge/atoll/internal/admin"
)

// testModuleRegisters runs the module with registration enabled against
// the cluster of TestAgainstAPIServer.
func testModuleRegisters(t *testing.T, client kubernetes.Interface, certDir string, base RegistrationConfig) {
	const name = "atoll-health-module"
	unrouteLogsAfter(t)
	var (
		srv *Server
		adm *admin.Server
	)
	app := fxtest.New(t,
		fx.Supply(admin.Config{Addr: "127.0.0.1:0"}, Config{Addr: "127.0.0.1:0", CertDir: certDir}, testLogger(t)),
		fx.Supply(RegistrationConfig{Enabled: true, Name: name, URL: base.URL, CABundle: base.CABundle}),
		fx.Provide(
			func() Policy { return protecting(protectedNode) },
			func() kubernetes.Interface { return client },
		),
		admin.Module,
		Module,
		fx.Populate(&srv, &adm),
	)
	app.RequireStart()
	mwcs := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	t.Cleanup(func() { _ = mwcs.Delete(context.Background(), name, metav1.DeleteOptions{}) })

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := poll.Until(ctx, func(ctx context.Context) error {
		_, err := mwcs.Get(ctx, name, metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatalf("module did not register: %v", err)
	}
	if srv.Addr() == "" {
		t.Error("server not started")
	}
	ready := get(t, "http://"+adm.Addr()+"/readyz")
	if !strings.Contains(ready, "[+] webhook ok") {
		t.Errorf("/readyz:\n%s", ready)
	}
	if m := get(t, "http://"+adm.Addr()+"/metrics"); !strings.Contains(m, `atoll_webhook_requests_total{kind="Node",result="patched"}`) {
		t.Errorf("/metrics lacks atoll_webhook_requests_total")
	}
	app.RequireStop()
	if err := srv.Ready(); err == nil {
		t.Error("ready after stop")
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // test helper
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestModuleConfigErrors(t *testing.T) {
	dir := t.TempDir()
	good := Config{Addr: "127.0.0.1:0", CertDir: dir}
	tests := []struct {
		name    string
		opts    []fx.Option
		wantErr string
	}{
		{
			name:    "server config",
			opts:    []fx.Option{fx.Supply(Config{Addr: ":0"})},
			wantErr: "cert dir",
		},
		{
			name:    "registration without client",
			opts:    []fx.Option{fx.Supply(good, RegistrationConfig{Enabled: true, URL: "https://127.0.0.1/m", CABundle: []byte("x")})},
			wantErr: "no kubernetes.Interface",
		},
		{
			name: "registration config",
			opts: []fx.Option{
				fx.Supply(good, RegistrationConfig{Enabled: true, CABundle: []byte("x")}),
				fx.Provide(func() kubernetes.Interface { return nil }),
			},
			wantErr: "url or service",
		},
		{
			name: "registration disabled needs no client",
			opts: []fx.Option{fx.Supply(good)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			unrouteLogsAfter(t)
			opts := append([]fx.Option{
				fx.NopLogger,
				fx.Supply(admin.Config{Addr: "127.0.0.1:0"}, testLogger(t)),
				fx.Provide(func() Policy { return protecting() }),
				admin.Module,
				Module,
			}, tt.opts...)
			checkErr(t, fx.New(opts...).Err(), tt.wantErr)
		})
	}
}
