package tunnelproto

import (
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// decodeFrame decodes a TunnelFrame from data, as proto.Unmarshal does,
// except that the payload is a slice of data instead of a copy: data
// must not change afterwards (a NATS message's Data is the receiver's
// own). A bulk stream so skips one copy and one frame-sized allocation
// per frame. Anything but the fields TunnelFrame has, with their wire
// types, goes to proto.Unmarshal, so the result (and every error) is
// always proto.Unmarshal's (FuzzDecodeFrame checks it).
func decodeFrame(data []byte, f *atollv1.TunnelFrame) error {
	f.Reset()
	b := data
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return proto.Unmarshal(data, f)
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType && (num == 2 || num == 3 || num == 6 || num >= 8 && num <= 10):
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return proto.Unmarshal(data, f)
			}
			b = b[n:]
			switch num {
			case 2:
				f.Sequence = v
			case 3:
				f.Kind = atollv1.FrameKind(int32(v))
			case 6:
				f.Window = uint32(v)
			case 8:
				f.Ack = v
			case 9:
				f.Limit = v
			case 10:
				f.Offset = v
			}
		case typ == protowire.BytesType && num >= 1 && num <= 7 && num != 2 && num != 3 && num != 6:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return proto.Unmarshal(data, f)
			}
			b = b[n:]
			if num == 4 {
				f.Payload = v[:len(v):len(v)]
				continue
			}
			if !utf8.Valid(v) {
				return proto.Unmarshal(data, f)
			}
			switch num {
			case 1:
				f.Session = string(v)
			case 5:
				f.Target = string(v)
			case 7:
				f.Error = string(v)
			}
		default:
			// An unknown field, or a known one with another wire type:
			// proto.Unmarshal keeps it as an unknown field, or fails.
			return proto.Unmarshal(data, f)
		}
	}
	return nil
}
