package events

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names on the hub.
const (
	StreamHealth   = "HEALTH"
	StreamTopology = "TOPOLOGY"
	StreamViews    = "VIEWS"
)

// StreamOptions tune the hub streams to the deployment.
type StreamOptions struct {
	// Replicas is 1 for a single hub server, 3 for a hub cluster.
	Replicas int
	// Storage is where the streams live; file unless testing.
	Storage jetstream.StorageType
	// MaxBytes caps each stream's storage (0: no cap); the oldest
	// messages go first.
	MaxBytes int64
}

// DefaultStreamOptions suit a single hub server.
func DefaultStreamOptions() StreamOptions {
	return StreamOptions{Replicas: 1, Storage: jetstream.FileStorage}
}

// Validate names the first bad field.
func (o StreamOptions) Validate() error {
	if o.Replicas < 1 || o.Replicas > 5 {
		return fmt.Errorf("stream replicas: %d is outside 1..5", o.Replicas)
	}
	if o.MaxBytes < 0 {
		return fmt.Errorf("stream max bytes: %d is negative", o.MaxBytes)
	}
	return nil
}

func (o StreamOptions) maxBytes() int64 {
	if o.MaxBytes == 0 {
		return -1
	}
	return o.MaxBytes
}

// Streams returns the definitions of every hub stream.
//
//   - HEALTH keeps the last few probe reports and votes per subject: health is
//     state, not history, and voters republish periodically.
//   - TOPOLOGY keeps the last report of each node.
//   - VIEWS keeps the last value of each view (a KV in all but name), so an
//     edge agent resumes from where it left off.
func Streams(o StreamOptions) []jetstream.StreamConfig {
	return []jetstream.StreamConfig{
		{
			Name:              StreamHealth,
			Description:       "Probe reports and votes from edge units",
			Subjects:          []string{HealthSubjects},
			Retention:         jetstream.LimitsPolicy,
			MaxMsgsPerSubject: 4,
			MaxAge:            time.Hour,
			Discard:           jetstream.DiscardOld,
			Duplicates:        2 * time.Minute,
			Storage:           o.Storage,
			Replicas:          o.Replicas,
			MaxBytes:          o.maxBytes(),
		},
		{
			Name:              StreamTopology,
			Description:       "Edge agents' reports of themselves",
			Subjects:          []string{TopoSubjects},
			Retention:         jetstream.LimitsPolicy,
			MaxMsgsPerSubject: 1,
			MaxAge:            7 * 24 * time.Hour,
			Discard:           jetstream.DiscardOld,
			Duplicates:        2 * time.Minute,
			Storage:           o.Storage,
			Replicas:          o.Replicas,
			MaxBytes:          o.maxBytes(),
		},
		{
			Name:              StreamViews,
			Description:       "The cloud's per-unit views for edge agents",
			Subjects:          []string{ViewSubjects},
			Retention:         jetstream.LimitsPolicy,
			MaxMsgsPerSubject: 1,
			Discard:           jetstream.DiscardOld,
			Duplicates:        2 * time.Minute,
			AllowRollup:       true,
			Storage:           o.Storage,
			Replicas:          o.Replicas,
			MaxBytes:          o.maxBytes(),
		},
	}
}

// EnsureStreams creates every hub stream or updates it to the current
// definition (see ReconcileStreams). It is safe to call from every replica
// at every start.
func EnsureStreams(ctx context.Context, js jetstream.JetStream, o StreamOptions) error {
	if err := o.Validate(); err != nil {
		return err
	}
	_, err := ReconcileStreams(ctx, js, o)
	return err
}

// ConsumerSpec defines a durable pull consumer that cloud replicas share.
type ConsumerSpec struct {
	Stream  string
	Durable string
	// FilterSubjects narrow the stream; empty means all of it.
	FilterSubjects []string
	// DeliverPolicy for the first start; later starts resume.
	DeliverPolicy jetstream.DeliverPolicy
	// AckWait bounds one handler run; the message is redelivered after it.
	AckWait time.Duration
	// MaxDeliver bounds redeliveries; the consumer terminates the message
	// on its last delivery instead of handing it back again.
	MaxDeliver int
	// MaxAckPending bounds messages in flight across all replicas.
	MaxAckPending int
}

// Validate names the first bad field.
func (s ConsumerSpec) Validate() error {
	switch {
	case s.Stream == "":
		return fmt.Errorf("consumer spec: stream is empty")
	case ValidToken(s.Durable) != nil:
		return fmt.Errorf("consumer spec %s: durable: %w", s.Stream, ValidToken(s.Durable))
	case s.AckWait <= 0:
		return fmt.Errorf("consumer %s: ack wait must be positive", s.Durable)
	case s.MaxDeliver < 1:
		return fmt.Errorf("consumer %s: max deliver must be at least 1", s.Durable)
	}
	return nil
}

func (s ConsumerSpec) config() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        s.Durable,
		FilterSubjects: s.FilterSubjects,
		DeliverPolicy:  s.DeliverPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.AckWait,
		MaxDeliver:     s.MaxDeliver,
		MaxAckPending:  s.MaxAckPending,
	}
}

// Consumers of the cloud services. A service refers to its consumer by one
// of these, so the full set is visible in one place.
var (
	// VoteConsumer feeds the cloud health service with every vote.
	VoteConsumer = ConsumerSpec{
		Stream:         StreamHealth,
		Durable:        "health-votes",
		FilterSubjects: []string{VoteSubjects},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		AckWait:        30 * time.Second,
		MaxDeliver:     10,
		MaxAckPending:  10000,
	}
)
