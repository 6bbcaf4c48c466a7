package webhook

import (
	"log/slog"
	"os"
	"testing"

	"github.com/go-logr/logr"

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/atoll-edge/atoll/cloud/kube"
)

// processLog outlives every test.
var processLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func TestMain(m *testing.M) {
	// controller-runtime's global logger (certwatcher logs through it) is
	// set once per process, first call wins. Set it here, so Module's call
	// in a test does not bind it to that test's output, which panics when
	// a later test's certwatcher logs.
	ctrllog.SetLogger(logr.FromSlogHandler(processLog.Handler()))
	os.Exit(m.Run())
}

// unrouteLogsAfter points client-go's global logger, which Module routes
// to the app's (here t's) logger, back at processLog when t ends: a
// client-go goroutine of a later test logging into a finished test's
// output panics.
func unrouteLogsAfter(t *testing.T) {
	t.Cleanup(func() { kube.RouteLogs(processLog) })
}
