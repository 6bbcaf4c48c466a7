package webhook

import (
	"log/slog"
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func TestMain(m *testing.M) {
	// controller-runtime's global logger (certwatcher logs through it) is
	// set once per process, first call wins. Set it here, so Module's call
	// in a test does not bind it to that test's output, which panics when
	// a later test's certwatcher logs.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	os.Exit(m.Run())
}
