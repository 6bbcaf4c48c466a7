package events

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// fuzzDecode checks that decoding arbitrary bytes on arbitrary subjects
// never panics, and that whatever decodes is consistent with its subject.
func fuzzDecode(f *testing.F, newMsg func() proto.Message, seeds ...proto.Message) {
	for _, s := range seeds {
		b, _ := proto.Marshal(s)
		f.Add("atoll.health.probe.u1.a", b)
		f.Add("atoll.health.ballot.u1.a", b)
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

func FuzzDecodeBallot(f *testing.F) {
	fuzzDecode(f, func() proto.Message { return &atollv1.Ballot{} },
		&atollv1.Ballot{Voter: "a", Unit: "u1", Members: 3, Votes: []*atollv1.Vote{{Node: "b", Verdict: atollv1.Verdict_VERDICT_HEALTHY, Normal: 2}}})
}

// exampleMessage is a message of family f whose identity fields agree
// with f's example subject, with every other scalar field set too, so the
// fuzzer starts from a valid payload.
func exampleMessage(f *Family) proto.Message {
	m := f.Message.ProtoReflect().New()
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsList() || fd.IsMap() {
			continue
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString("x"))
		case protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte{1, 2}))
		case protoreflect.BoolKind:
			m.Set(fd, protoreflect.ValueOfBool(true))
		case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
			m.Set(fd, protoreflect.ValueOfInt32(3))
		case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
			m.Set(fd, protoreflect.ValueOfInt64(3))
		case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
			m.Set(fd, protoreflect.ValueOfUint32(3))
		case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
			m.Set(fd, protoreflect.ValueOfUint64(3))
		}
	}
	for i, name := range f.Names() {
		if field, ok := f.Identity[name]; ok {
			m.Set(fields.ByName(protoreflect.Name(field)), protoreflect.ValueOfString(f.Example[i]))
		}
	}
	return m.Interface()
}

// decoded lists every message type an untrusted party can send to the
// cloud or an edge, with the family it arrives on: every family's
// message, and the status reply (which `atoll status` decodes).
func decoded() []struct {
	family *Family
	msg    proto.Message
} {
	var out []struct {
		family *Family
		msg    proto.Message
	}
	for _, f := range catalog {
		out = append(out, struct {
			family *Family
			msg    proto.Message
		}{f, f.Message})
		if f.Reply != nil {
			out = append(out, struct {
				family *Family
				msg    proto.Message
			}{f, f.Reply})
		}
	}
	return out
}

// FuzzDecodeCatalog decodes arbitrary bytes on arbitrary subjects as every
// message type of the catalog (which is the index into decoded()): what
// the cloud's consumers (ballots, topology updates, status requests) and the
// edge's (probe reports, assignments, unit views, hosts and object views,
// tunnel frames) decode from the network. It never panics; what decodes
// passes the identity check of its subject and survives a round trip;
// what does not decode fails with one of the sentinel errors
// (ErrUndecodable, ErrTypeMismatch, ErrIdentity, ErrWrongSubject,
// ErrInvalidToken, ErrEmptyToken), which the one consume contract maps to
// a reason, terminates and counts (atoll_events_terminated_total{reason}).
func FuzzDecodeCatalog(f *testing.F) {
	for i, d := range decoded() {
		subj, err := d.family.ExampleSubject()
		if err != nil {
			f.Fatal(err)
		}
		ex := exampleMessage(d.family)
		if d.msg != d.family.Message {
			ex = d.msg // a reply: no identity
		}
		b, err := proto.Marshal(ex)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), subj, b, TypeName(d.msg))
		f.Add(uint8(i), subj, []byte{0x0a, 0xff}, "")
		f.Add(uint8(i), subj+".extra", b, "")
	}
	types := decoded()
	f.Fuzz(func(t *testing.T, which uint8, subject string, data []byte, header string) {
		d := types[int(which)%len(types)]
		m := d.msg.ProtoReflect().New().Interface()
		msg := &nats.Msg{Subject: subject, Data: data, Header: nats.Header{}}
		if header != "" {
			msg.Header.Set(HeaderType, header)
		}
		err := DecodeMsg(msg, m)
		if err != nil {
			known := false
			for _, e := range []error{ErrUndecodable, ErrTypeMismatch, ErrIdentity, ErrWrongSubject, ErrInvalidToken, ErrEmptyToken} {
				known = known || errors.Is(err, e)
			}
			if !known {
				t.Fatalf("decode error without a sentinel: %v", err)
			}
			return
		}
		if err := CheckIdentity(subject, m); err != nil {
			t.Fatalf("decoded but identity fails: %v", err)
		}
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		again := d.msg.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(b, again); err != nil || !proto.Equal(m, again) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// TestFuzzSeedsDecode: the fuzzer's seeds are valid for every message type
// of the catalog, so FuzzDecodeCatalog starts from what really travels.
func TestFuzzSeedsDecode(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range decoded() {
		seen[TypeName(d.msg)] = true
		if d.msg != d.family.Message {
			continue
		}
		subj, _ := d.family.ExampleSubject()
		b, _ := proto.Marshal(exampleMessage(d.family))
		m := d.msg.ProtoReflect().New().Interface()
		if err := DecodeMsg(&nats.Msg{Subject: subj, Data: b, Header: nats.Header{}}, m); err != nil {
			t.Errorf("%s on %s: %v", TypeName(d.msg), subj, err)
		}
	}
	for _, f := range catalog {
		if !seen[TypeName(f.Message)] {
			t.Errorf("family %s's message is not fuzzed", f.Name)
		}
	}
	t.Logf("fuzzed types: %d", len(seen))
}
