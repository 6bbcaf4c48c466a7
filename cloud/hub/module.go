package hub

import (
	"context"
	"errors"
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/internal/admin"
)

// Module runs the embedded hub with the app. It needs a Config and a
// *slog.Logger.
var Module = fx.Module("hub",
	fx.Provide(newForApp),
)

func newForApp(lc fx.Lifecycle, cfg Config, log *slog.Logger, adm *admin.Server) (*Hub, error) {
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
