// Package quorum is Atoll's one majority rule, used twice: by each edge
// voter over its unit's probe reports (is node N normal?) and by the cloud
// over the voters' votes (what do the peers say about N?).
//
// About a node N, only the opinions of the other current members of N's
// unit count: N's own report or vote about itself never does (a node cut
// from everyone would otherwise vouch for itself). A verdict needs fresh
// opinions from more than half of those others — SuperEdge's threshold of
// (members+1)/2 — and then their strict majority decides. A unit of one
// member therefore never has a verdict.
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

// Needed is the number of fresh opinions from the other members that a
// verdict about a node of a unit of members needs: more than half of the
// members-1 others, which is (members+1)/2 for members >= 2. A unit of one
// (or none) can never reach it.
func Needed(members int) int {
	others := members - 1
	if others < 1 {
		return 1 // unreachable: there is nobody else to count
	}
	return others/2 + 1
}

// Verdict is the rule about node N of a unit of members: yes, no and
// abstain count the fresh opinions about N from the other current members
// only (the caller drops N's own and everyone else's). Fewer than
// Needed(members) of them give no verdict; otherwise Majority decides.
func Verdict(members, yes, no, abstain int) atollv1.Verdict {
	fresh := yes + no + abstain
	if members < 2 || yes < 0 || no < 0 || abstain < 0 || fresh < Needed(members) {
		return atollv1.Verdict_VERDICT_NONE
	}
	return Majority(yes, no, abstain)
}
