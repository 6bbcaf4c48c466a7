package natstest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
)

// CloudJetStream connects to h as the cloud service and returns the
// connection (closed with the test) and its JetStream in h's domain.
func CloudJetStream(t testing.TB, h *hub.Hub) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// CloudStreams is CloudJetStream with the hub's streams made as
// atoll-cloud makes them, in memory.
func CloudStreams(t testing.TB, h *hub.Hub) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, js := CloudJetStream(t, h)
	o := events.DefaultStreamOptions()
	o.Storage = jetstream.MemoryStorage
	if err := eventbus.EnsureStreams(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	return nc, js
}
