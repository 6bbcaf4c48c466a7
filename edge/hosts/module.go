package hosts

import (
	"log/slog"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

type params struct {
	fx.In
	Lifecycle  fx.Lifecycle
	Config     Config
	Link       *hublink.Link
	Membership *membership.Membership
	Log        *slog.Logger
	Events     *events.Metrics
}

// Module runs the hosts writer with atoll-edge when Config.Path is set,
// for the unit the membership names.
var Module = fx.Module("hosts",
	fx.Provide(func(p params) (*Writer, error) {
		if p.Config.Path == "" {
			return nil, nil
		}
		w, err := New(p.Config, p.Link, units{p.Membership}, p.Log, p.Events)
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
