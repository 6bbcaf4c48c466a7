package events

import (
	"fmt"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Headers every Atoll message carries.
const (
	HeaderType          = "Atoll-Type"
	HeaderContentType   = "Content-Type"
	ContentTypeProtobuf = "application/protobuf"
)

// TypeName is the Atoll-Type header value for m: its full protobuf name.
func TypeName(m proto.Message) string {
	return string(m.ProtoReflect().Descriptor().FullName())
}

// NewMsg encodes m for subject with Atoll's headers. id becomes the
// Nats-Msg-Id used by JetStream to drop duplicates; it must be unique per
// logical event (a retry of the same event reuses it). An empty id sets none.
func NewMsg(subject string, m proto.Message, id string) (*nats.Msg, error) {
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("encode %s for %s: %w", TypeName(m), subject, err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set(HeaderContentType, ContentTypeProtobuf)
	msg.Header.Set(HeaderType, TypeName(m))
	if id != "" {
		msg.Header.Set(nats.MsgIdHdr, id)
	}
	return msg, nil
}

// NewMessage returns an empty message of the Atoll type named typ.
func NewMessage(typ string) (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	if err != nil || mt.Descriptor().ParentFile().Package() != atollv1.File_atoll_v1_health_proto.Package() {
		return nil, fmt.Errorf("%w: %q", ErrUnknownType, typ)
	}
	return mt.New().Interface(), nil
}

// Decode decodes data as the Atoll message type named typ.
func Decode(typ string, data []byte) (proto.Message, error) {
	m, err := NewMessage(typ)
	if err != nil {
		return nil, err
	}
	if err := proto.Unmarshal(data, m); err != nil {
		return nil, fmt.Errorf("%w: as %s: %w", ErrUndecodable, typ, err)
	}
	return m, nil
}

// DecodeMsg decodes msg into m, checking that the type header (if present)
// names m's type and that m's identity fields agree with the subject.
func DecodeMsg(msg *nats.Msg, m proto.Message) error {
	if typ := msg.Header.Get(HeaderType); typ != "" && typ != TypeName(m) {
		return fmt.Errorf("%w: header %s=%q, want %q", ErrTypeMismatch, HeaderType, typ, TypeName(m))
	}
	if err := proto.Unmarshal(msg.Data, m); err != nil {
		return fmt.Errorf("%w: as %s: %w", ErrUndecodable, TypeName(m), err)
	}
	return CheckIdentity(msg.Subject, m)
}

// CheckIdentity verifies that the identity fields of m (checker, voter,
// node, unit, ...) match the tokens of the subject it arrived on, so that a
// node cannot speak for another by lying in the payload. The fields and
// tokens are the Identity of the catalog family of subject that carries m's
// type (a TunnelFrame travels in three); a type no family carries (a reply)
// is not checked.
func CheckIdentity(subject string, m proto.Message) error {
	f := familyOfType(subject, m)
	if f == nil {
		return nil
	}
	return f.checkIdentity(subject, m)
}
