package quorum

import (
	"fmt"
	"testing"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func TestMajority(t *testing.T) {
	H, U, N := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY, atollv1.Verdict_VERDICT_NONE
	tests := []struct {
		name             string
		yes, no, abstain int
		want             atollv1.Verdict
	}{
		{"nobody", 0, 0, 0, N},
		{"one yes", 1, 0, 0, H},
		{"one no", 0, 1, 0, U},
		{"unanimous", 3, 0, 0, H},
		{"majority yes", 2, 1, 0, H},
		{"majority no", 1, 2, 0, U},
		{"two against two", 2, 2, 0, N},
		{"exactly half of six", 3, 3, 0, N},
		{"four of seven", 4, 3, 0, H},
		{"abstentions block a majority", 2, 0, 2, N},
		{"abstentions do not block a clear one", 3, 0, 2, H},
		{"abstentions alone decide nothing", 0, 0, 3, N},
		{"negative counts decide nothing", -1, 0, 0, N},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Majority(tt.yes, tt.no, tt.abstain); got != tt.want {
				t.Fatalf("Majority(%d, %d, %d) = %v, want %v", tt.yes, tt.no, tt.abstain, got, tt.want)
			}
		})
	}
}

func TestNeeded(t *testing.T) {
	// SuperEdge's threshold, (members+1)/2, for every unit with others.
	for members := 2; members <= 7; members++ {
		if got, want := Needed(members), (members+1)/2; got != want {
			t.Errorf("Needed(%d) = %d, want %d", members, got, want)
		}
		// And it is "more than half of the others".
		if others := members - 1; 2*Needed(members) <= others || 2*(Needed(members)-1) > others {
			t.Errorf("Needed(%d) = %d is not the least count above half of %d others", members, Needed(members), others)
		}
	}
}

func TestVerdict(t *testing.T) {
	H, U, N := atollv1.Verdict_VERDICT_HEALTHY, atollv1.Verdict_VERDICT_UNHEALTHY, atollv1.Verdict_VERDICT_NONE
	tests := []struct {
		members          int
		yes, no, abstain int
		want             atollv1.Verdict
	}{
		// A unit of one: nobody else, never a verdict.
		{1, 0, 0, 0, N},
		{1, 1, 0, 0, N}, // a caller that let the node's own opinion through still gets none
		// Two: the other member decides alone.
		{2, 0, 0, 0, N},
		{2, 1, 0, 0, H},
		{2, 0, 1, 0, U},
		{2, 0, 0, 1, N},
		// Three: both others must be fresh.
		{3, 1, 0, 0, N},
		{3, 0, 1, 0, N},
		{3, 2, 0, 0, H},
		{3, 0, 2, 0, U},
		{3, 1, 1, 0, N},
		{3, 1, 0, 1, N},
		// Four: two of three others.
		{4, 1, 0, 0, N},
		{4, 2, 0, 0, H},
		{4, 0, 2, 0, U},
		{4, 1, 1, 0, N},
		{4, 2, 1, 0, H},
		{4, 1, 2, 0, U},
		{4, 2, 0, 1, H},
		// Five: three of four others; two against two ties.
		{5, 2, 0, 0, N},
		{5, 3, 0, 0, H},
		{5, 2, 1, 0, H},
		{5, 2, 2, 0, N},
		{5, 0, 3, 0, U},
		{5, 1, 1, 1, N},
		// Six: three of five.
		{6, 2, 0, 0, N},
		{6, 3, 0, 0, H},
		{6, 2, 1, 0, H},
		{6, 3, 2, 0, H},
		{6, 2, 2, 1, N},
		// Seven: four of six; three against three ties.
		{7, 3, 0, 0, N},
		{7, 4, 0, 0, H},
		{7, 3, 1, 0, H},
		{7, 3, 3, 0, N},
		{7, 2, 4, 0, U},
		{7, 2, 2, 2, N},
		// Nonsense counts decide nothing.
		{3, -1, 3, 0, N},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d members %d yes %d no %d abstain", tt.members, tt.yes, tt.no, tt.abstain), func(t *testing.T) {
			if got := Verdict(tt.members, tt.yes, tt.no, tt.abstain); got != tt.want {
				t.Fatalf("Verdict(%d, %d, %d, %d) = %v, want %v", tt.members, tt.yes, tt.no, tt.abstain, got, tt.want)
			}
		})
	}
}
