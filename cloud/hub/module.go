package hub

import (
	"context"
	"errors"
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/internal/admin"
)

// Module runs the embedded hub with the app. It needs a Config and a
// *slog.Logger; a LeafCertificates in the app (cloud/hubtls) puts the
// leaf listener on TLS with it.
var Module = fx.Module("hub",
	fx.Provide(newForApp),
)

type params struct {
	fx.In
	LC    fx.Lifecycle
	Cfg   Config
	Log   *slog.Logger
	Admin *admin.Server
	Leaf  LeafCertificates `optional:"true"`
}

func newForApp(p params) (*Hub, error) {
	lc, cfg, log, adm := p.LC, p.Cfg, p.Log, p.Admin
	if p.Leaf != nil {
		cfg.LeafCertificates = p.Leaf
	}
	h, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	lc.Append(fx.StartStopHook(h.Start, h.Shutdown))
	adm.AddReadiness("hub-server", func(context.Context) error {
		if !h.srv.Running() {
			return errors.New("hub server not running")
		}
		return nil
	})
	adm.Registerer().MustRegister(newCollector(h))
	return h, nil
}
