package kube

import (
	"log/slog"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// RouteLogs sends what client-go (klog) and controller-runtime log to log,
// so that atoll-cloud writes one structured stream: without it, client-go's
// reflector and leader-election messages go to stderr in klog's own format,
// and controller-runtime prints a stack trace when nobody set its logger.
// klog's verbosity levels map to slog levels below Info (V(1) is Debug).
func RouteLogs(log *slog.Logger) {
	klog.SetSlogLogger(log.With("component", "client-go"))
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler()))
}
