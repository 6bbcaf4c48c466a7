package admin

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"
)

// Module provides the admin server and the metrics registerer, and runs
// the server with the app.
var Module = fx.Module("admin",
	fx.Provide(
		New,
		func(s *Server) prometheus.Registerer { return s.Registerer() },
	),
	fx.Invoke(func(lc fx.Lifecycle, s *Server) {
		lc.Append(fx.StartStopHook(s.Start, s.Stop))
	}),
)
