package events

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Mode says who reads a consumer's messages.
type Mode int

const (
	// Shared is a durable pull consumer: processes running the same spec
	// share its messages, and each message is handled (and acked) by one
	// of them. For work that must happen once: record a ballot and patch its Nodes.
	Shared Mode = iota
	// Follow gives every process every message (an ordered consumer of
	// its own, nothing acked), for state that each cloud replica or edge
	// agent rebuilds on its own: vote tallies, topology, views.
	Follow
)

func (m Mode) String() string {
	switch m {
	case Shared:
		return "shared"
	case Follow:
		return "follow"
	default:
		return fmt.Sprintf("mode(%d)", int(m))
	}
}

// ConsumerSpec defines a consumer of a hub stream.
type ConsumerSpec struct {
	// Name is the durable name of a Shared consumer, and the consumer
	// label of logs and metrics in both modes.
	Name string
	Mode Mode
	// Stream is the hub stream read.
	Stream string
	// FilterSubjects narrow the stream; empty means all of it.
	FilterSubjects []string
	// DeliverPolicy is where a new consumer starts. A Shared consumer
	// resumes where it left off; a Follow consumer (and a Shared one that
	// was lost and is recreated) starts here again.
	DeliverPolicy jetstream.DeliverPolicy
	// AckWait bounds one handler run. A Shared message not acked by then
	// is redelivered.
	AckWait time.Duration
	// MaxDeliver bounds the attempts at one message; the last failed
	// attempt ends it in a terminal state (terminated, counted, logged).
	MaxDeliver int
	// MaxAckPending bounds the messages in flight across every process
	// sharing a Shared consumer (0: server default).
	MaxAckPending int
}

// Validate names the first bad field.
func (s ConsumerSpec) Validate() error {
	switch {
	case ValidToken(s.Name) != nil:
		return fmt.Errorf("consumer spec: name: %w", ValidToken(s.Name))
	case s.Mode != Shared && s.Mode != Follow:
		return fmt.Errorf("consumer %s: mode: %v is neither shared nor follow", s.Name, s.Mode)
	case s.Stream == "":
		return fmt.Errorf("consumer %s: stream is empty", s.Name)
	case s.AckWait <= 0:
		return fmt.Errorf("consumer %s: ack wait must be positive", s.Name)
	case s.MaxDeliver < 1:
		return fmt.Errorf("consumer %s: max deliver must be at least 1", s.Name)
	case s.MaxAckPending < 0:
		return fmt.Errorf("consumer %s: max ack pending must not be negative", s.Name)
	}
	return nil
}

// DurableConfig is the server configuration of a Shared consumer of s.
func (s ConsumerSpec) DurableConfig() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:        s.Name,
		FilterSubjects: s.FilterSubjects,
		DeliverPolicy:  s.DeliverPolicy,
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        s.AckWait,
		MaxDeliver:     s.MaxDeliver,
		MaxAckPending:  s.MaxAckPending,
	}
}

// OrderedConfig is the configuration of a Follow consumer of s.
func (s ConsumerSpec) OrderedConfig() jetstream.OrderedConsumerConfig {
	return jetstream.OrderedConsumerConfig{
		FilterSubjects: s.FilterSubjects,
		DeliverPolicy:  s.DeliverPolicy,
	}
}

// FollowSpec is a Follow consumer named name of the last message of every
// subject matching filters in stream, then of every new one, with the
// default retry bounds: 5 attempts of at most 30s each.
func FollowSpec(name, stream string, filters ...string) ConsumerSpec {
	return ConsumerSpec{
		Name:           name,
		Mode:           Follow,
		Stream:         stream,
		FilterSubjects: filters,
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		AckWait:        30 * time.Second,
		MaxDeliver:     5,
	}
}

// The consumers of Atoll's services. A service refers to its consumer by
// one of these, so the full set is visible in one place.
var (
	// BallotConsumer feeds the cloud health service with every ballot,
	// each handled by one replica (the leader's reconciles).
	BallotConsumer = ConsumerSpec{
		Name:           "health-ballots",
		Mode:           Shared,
		Stream:         StreamHealth,
		FilterSubjects: []string{BallotSubjects},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
		AckWait:        30 * time.Second,
		MaxDeliver:     10,
		MaxAckPending:  10000,
	}
	// BallotFollower gives every cloud replica every ballot (the tallies).
	BallotFollower = FollowSpec("ballots", StreamHealth, BallotSubjects)
	// TopologyFollower gives every cloud replica every node's report.
	TopologyFollower = FollowSpec("topology", StreamTopology, NodeTopologySubjects)
	// UnitEventConsumer hands each unit lifecycle event to one replica's
	// grid controllers (the leader's: they enqueue the grids of the unit
	// label there). Created anew, it delivers what the stream holds: the
	// last event of each unit (TOPOLOGY keeps one per subject), so
	// deliver-all starts where last-per-subject would, without depending
	// on how the server places the start of a filter that matches nothing
	// yet (a new installation).
	UnitEventConsumer = ConsumerSpec{
		Name:           "grid-units",
		Mode:           Shared,
		Stream:         StreamTopology,
		FilterSubjects: []string{UnitEventSubjects},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		AckWait:        30 * time.Second,
		MaxDeliver:     20,
		MaxAckPending:  1000,
	}
)
