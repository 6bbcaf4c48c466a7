package admin

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// recorder registers with a registry and remembers the descriptors of
// what it registered: a vector with no series yet is absent from a
// scrape, but its descriptor names it (docs/reference/metrics.md is checked
// against them).
type recorder struct {
	reg *prometheus.Registry

	mu    sync.Mutex
	descs []*prometheus.Desc
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	ch := make(chan *prometheus.Desc)
	var descs []*prometheus.Desc
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		descs = append(descs, d)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.descs = append(r.descs, descs...)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters c; its descriptors stay recorded (what was
// ever exported).
func (r *recorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

func (r *recorder) descriptors() []*prometheus.Desc {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*prometheus.Desc(nil), r.descs...)
}
