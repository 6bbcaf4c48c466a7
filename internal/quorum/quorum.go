// Package quorum is Atoll's one majority rule, used twice: by each edge
// voter over its unit's probe reports (is node N normal?) and by the cloud
// over the voters' votes (what do the peers say about N?).
package quorum

import atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"

// Majority returns healthy when more than half of all counted opinions say
// yes, unhealthy when more than half say no, and no verdict otherwise: a
// tie, too many abstentions, or nobody counted. Abstentions (undecided
// voters) count in the total, so they can prevent a verdict but never make
// one.
func Majority(yes, no, abstain int) atollv1.Verdict {
	total := yes + no + abstain
	switch {
	case total <= 0:
		return atollv1.Verdict_VERDICT_NONE
	case 2*yes > total:
		return atollv1.Verdict_VERDICT_HEALTHY
	case 2*no > total:
		return atollv1.Verdict_VERDICT_UNHEALTHY
	default:
		return atollv1.Verdict_VERDICT_NONE
	}
}
