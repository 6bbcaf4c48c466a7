package health

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func TestValidBallot(t *testing.T) {
	s := &Service{cfg: DefaultConfig()} // max TTL 3m, max skew 30s
	hub := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		at   time.Time
		ttl  time.Duration
		ok   bool
	}{
		{"on time", hub, 15 * time.Second, true},
		{"no TTL (the default applies)", hub, 0, true},
		{"the voters' default TTL", hub, 75 * time.Second, true},
		{"TTL at the maximum", hub, 3 * time.Minute, true},
		{"TTL above the maximum", hub, 3*time.Minute + time.Second, false},
		{"voter clock behind within skew", hub.Add(-29 * time.Second), 15 * time.Second, true},
		{"voter clock ahead within skew", hub.Add(29 * time.Second), 15 * time.Second, true},
		{"dated in the future", hub.Add(31 * time.Second), 15 * time.Second, false},
		{"dated in the past", hub.Add(-time.Hour), 15 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &atollv1.Ballot{Unit: "u1", Voter: "b", Time: timestamppb.New(tt.at), Votes: []*atollv1.Vote{{Node: "a"}}}
			if tt.ttl > 0 {
				b.Ttl = durationpb.New(tt.ttl)
			}
			err := s.validBallot(b, hub)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBallotRejected)) {
				t.Fatalf("validBallot = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	if err := s.validBallot(&atollv1.Ballot{Unit: "u1", Voter: "b"}, hub); !errors.Is(err, ErrBallotRejected) {
		t.Fatalf("ballot without a time: %v", err)
	}
}
