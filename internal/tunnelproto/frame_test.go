package tunnelproto

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

func frameSeeds() [][]byte {
	var out [][]byte
	for _, f := range []*atollv1.TunnelFrame{
		{Session: "s1", Sequence: 1, Kind: atollv1.FrameKind_FRAME_KIND_OPEN, Target: "n1:10250", Ack: 0, Limit: 1 << 20},
		{Session: "s1", Sequence: 7, Kind: atollv1.FrameKind_FRAME_KIND_DATA, Payload: []byte("hello"), Offset: 123, Ack: 4, Limit: 99},
		{Session: "s1", Kind: atollv1.FrameKind_FRAME_KIND_WINDOW, Ack: 9, Limit: 1 << 40, Window: 77},
		{Session: "s1", Kind: atollv1.FrameKind_FRAME_KIND_ERROR, Error: "target refused"},
		{Session: "s1", Kind: atollv1.FrameKind(-3), Payload: []byte{}},
	} {
		b, _ := proto.Marshal(f)
		out = append(out, b)
	}
	out = append(out,
		[]byte{0x0a, 0x02, 0xff, 0xfe},           // session not UTF-8
		[]byte{0x10, 0x80},                       // truncated varint
		[]byte{0x22, 0x05, 'a'},                  // truncated payload
		[]byte{0x12, 0x01, 'x'},                  // sequence as bytes
		[]byte{0x58, 0x01},                       // unknown field 11
		[]byte{0x22, 0x01, 'a', 0x22, 0x01, 'b'}, // payload twice: last wins
	)
	return out
}

// TestDecodeFrame: decodeFrame agrees with proto.Unmarshal on the seeds
// and aliases the payload.
func TestDecodeFrame(t *testing.T) {
	for _, b := range frameSeeds() {
		checkDecode(t, b)
	}
	data, _ := proto.Marshal(&atollv1.TunnelFrame{Kind: atollv1.FrameKind_FRAME_KIND_DATA, Payload: []byte("abc")})
	var f atollv1.TunnelFrame
	if err := decodeFrame(data, &f); err != nil {
		t.Fatal(err)
	}
	if i := bytes.Index(data, []byte("abc")); &data[i] != &f.Payload[0] || cap(f.Payload) != 3 {
		t.Fatalf("payload not aliased with its capacity capped")
	}
}

func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	var got, want atollv1.TunnelFrame
	gerr := decodeFrame(bytes.Clone(b), &got)
	werr := proto.Unmarshal(b, &want)
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("%x: decodeFrame error %v, proto.Unmarshal %v", b, gerr, werr)
	}
	if werr == nil && !proto.Equal(&got, &want) {
		t.Fatalf("%x: decodeFrame %v, proto.Unmarshal %v", b, &got, &want)
	}
}

// FuzzDecodeFrame: decodeFrame is proto.Unmarshal on any input.
func FuzzDecodeFrame(f *testing.F) {
	for _, b := range frameSeeds() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecode(t, b) })
}
