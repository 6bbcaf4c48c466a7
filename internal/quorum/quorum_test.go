package quorum

import (
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
