package topology

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/cloud/kube"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/hublink"
)

type params struct {
	fx.In
	Lifecycle fx.Lifecycle
	Config    Config
	Bus       *hublink.Link
	Kube      *kube.Kube `optional:"true"`
	Log       *slog.Logger
	Registry  prometheus.Registerer
	Events    *events.Metrics
}

// Module runs the topology service with the app. With the kubernetes
// source it needs *kube.Kube.
var Module = fx.Module("topology",
	fx.Provide(newForApp),
	fx.Invoke(func(*Service) {}),
)

func newForApp(p params) (*Service, error) {
	var s *Service
	if p.Config.Source == SourceKubernetes && p.Kube != nil {
		inf := p.Kube.Informers.Core().V1().Nodes()
		svc, err := New(p.Config, p.Bus, inf.Lister(), p.Log, newMetrics(p.Registry), p.Events)
		if err != nil {
			return nil, err
		}
		s = svc
		if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.Changed() },
			UpdateFunc: func(any, any) { s.Changed() },
			DeleteFunc: func(any) { s.Changed() },
		}); err != nil {
			return nil, err
		}
	} else {
		svc, err := New(p.Config, p.Bus, nil, p.Log, newMetrics(p.Registry), p.Events)
		if err != nil {
			return nil, err
		}
		s = svc
	}
	fxrun.Background(p.Lifecycle, p.Log, "topology", s.Run)
	return s, nil
}
