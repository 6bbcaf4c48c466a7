package grid

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	appsv1alpha1 "github.com/atoll-edge/atoll/schemas/apps/v1alpha1"
)

// Module runs the grid controllers on the manager of cloud/manager when
// Config.Mode allows: "auto" asks the apiserver whether apps.atoll.io is
// served (deploy/crds installed) and, if not, logs that grids are off
// (install the CRDs and restart atoll-cloud to turn them on). The unit
// lifecycle events of the hub drive the grids of the unit label
// (ConsumeUnitEvents). It provides *Controllers, nil when they do not run.
var Module = fx.Module("grid",
	fx.Provide(newForApp),
	fx.Invoke(func(*Controllers) {}),
)

func newForApp(cfg Config, m *manager.Manager, link *hublink.Link, evm *eventbus.Metrics, log *slog.Logger, reg prometheus.Registerer) (*Controllers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch cfg.Mode {
	case ModeOff:
		return nil, nil
	case ModeAuto:
		served, err := Served(m.GetConfig())
		if err != nil {
			return nil, err
		}
		if !served {
			log.Warn("grid controllers off: apps.atoll.io is not served (apply deploy/crds and restart)", "component", "grid")
			return nil, nil
		}
	}
	c, err := New(cfg, m, log, reg)
	if err != nil {
		return nil, err
	}
	c.ConsumeUnitEvents(m, link, evm)
	return c, nil
}

// Served reports whether the apiserver serves apps.atoll.io/v1alpha1.
func Served(rc *rest.Config) (bool, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return false, fmt.Errorf("grid: discovery: %w", err)
	}
	_, err = dc.ServerResourcesForGroupVersion(appsv1alpha1.GroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("grid: discover %s: %w", appsv1alpha1.GroupVersion, err)
	}
	return true, nil
}
