package hosts

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/internal/fxrun"
)

type params struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     Config
	Feeds      *viewfeed.Feeds
	Membership *membership.Membership
	Log        *slog.Logger
}

// Module runs the hosts writer with atoll-edge when Config.Path is set,
// for the unit the membership names.
var Module = fx.Module("hosts",
	fx.Provide(func(p params) (*Writer, error) {
		if p.Config.Path == "" {
			return nil, nil
		}
		w, err := New(p.Config, p.Feeds, units{p.Membership}, p.Log)
		if err != nil {
			return nil, err
		}
		fxrun.Background(p.Lifecycle, p.Log, "hosts", w.Run)
		return w, nil
	}),
	fx.Invoke(func(*Writer) {}),
)

type units struct{ m *membership.Membership }

func (u units) Unit() string             { return u.m.Current().Unit }
func (u units) Changes() <-chan struct{} { return u.m.Changes() }
