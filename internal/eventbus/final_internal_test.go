package eventbus

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A cluster whose servers have not all met answers "no suitable peers" to an
// R3 create; start must wait for it, not fail. A refused config must not be
// retried.
func TestFinalErrors(t *testing.T) {
	for _, c := range []struct {
		err   error
		final bool
	}{
		{&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement, peer offline"}, false},
		{fmt.Errorf("create: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008}), false},
		{&jetstream.APIError{Code: 408}, false},
		{context.DeadlineExceeded, false},
		{&jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "stream configuration for replicas is invalid"}, true},
		{&jetstream.APIError{Code: 500, ErrorCode: 10049}, true},
	} {
		if got := final(c.err); got != c.final {
			t.Errorf("final(%v) = %v, want %v", c.err, got, c.final)
		}
	}
}
