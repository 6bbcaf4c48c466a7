package events

import (
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// fuzzDecode checks that decoding arbitrary bytes on arbitrary subjects
// never panics, and that whatever decodes is consistent with its subject.
func fuzzDecode(f *testing.F, newMsg func() proto.Message, seeds ...proto.Message) {
	for _, s := range seeds {
		b, _ := proto.Marshal(s)
		f.Add("atoll.health.probe.u1.a", b)
		f.Add("atoll.health.vote.u1.b.a", b)
	}
	f.Add("atoll.health.probe.u1.a", []byte{0xff, 0x01})
	f.Add("atoll.health.probe..a", []byte{})
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		m := newMsg()
		err := DecodeMsg(&nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}, m)
		if err != nil {
			return
		}
		if err := CheckIdentity(subject, m); err != nil {
			t.Fatalf("decoded but identity fails: %v", err)
		}
		// Whatever decodes re-encodes and decodes to the same message.
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again := newMsg()
		if err := proto.Unmarshal(b, again); err != nil || !proto.Equal(m, again) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

func FuzzDecodeProbeReport(f *testing.F) {
	fuzzDecode(f, func() proto.Message { return &atollv1.ProbeReport{} },
		&atollv1.ProbeReport{Checker: "a", Unit: "u1", Sequence: 7, Peers: []*atollv1.PeerResult{{Node: "b", Normal: true, Score: 100}}})
}

func FuzzDecodeVote(f *testing.F) {
	fuzzDecode(f, func() proto.Message { return &atollv1.Vote{} },
		&atollv1.Vote{Voter: "a", Node: "b", Unit: "u1", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 2, Checkers: 3})
}
