package events

import (
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// BallotVotes reads a ballot as the votes it stands for, one per entry: the
// voter's verdict on that member, made at the ballot's time and counting
// for its ttl. The cloud tallies these as it tallies single votes. Entries
// about the voter itself are left out (a node's word about itself never
// counts), and so is a second entry about the same node.
func BallotVotes(b *atollv1.Ballot) []*atollv1.Vote {
	out := make([]*atollv1.Vote, 0, len(b.GetEntries()))
	seen := make(map[string]bool, len(b.GetEntries()))
	for _, e := range b.GetEntries() {
		if e.GetNode() == "" || e.GetNode() == b.GetVoter() || seen[e.GetNode()] {
			continue
		}
		seen[e.GetNode()] = true
		out = append(out, &atollv1.Vote{
			Voter: b.GetVoter(), Node: e.GetNode(), Unit: b.GetUnit(), Verdict: e.GetVerdict(),
			Normal: e.GetNormal(), Abnormal: e.GetAbnormal(), Checkers: e.GetNormal() + e.GetAbnormal(),
			Members: b.GetMembers(), Time: b.GetTime(), Since: e.GetSince(), Ttl: b.GetTtl(),
		})
	}
	return out
}
