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

// TypeForSubject names the message type a catalog subject carries, for
// messages that arrive without a type header (e.g. published by hand).
func TypeForSubject(subject string) (string, error) {
	var m proto.Message
	if subject == StatusSubject {
		m = &atollv1.StatusRequest{}
	} else if _, _, err := ParseProbeSubject(subject); err == nil {
		m = &atollv1.ProbeReport{}
	} else if _, _, _, err := ParseVoteSubject(subject); err == nil {
		m = &atollv1.Vote{}
	} else if _, err := ParseTopologySubject(subject); err == nil {
		m = &atollv1.TopologyUpdate{}
	} else if _, _, _, err := ParseTunnelSubject(subject); err == nil {
		m = &atollv1.TunnelFrame{}
	} else if k, err := ParseViewSubject(subject); err == nil {
		switch k.Kind {
		case KindUnit:
			m = &atollv1.UnitView{}
		case KindHosts:
			m = &atollv1.HostRecords{}
		case KindAssignment:
			m = &atollv1.NodeAssignment{}
		default:
			m = &atollv1.ObjectView{}
		}
	} else {
		return "", fmt.Errorf("%w: %q", ErrWrongSubject, subject)
	}
	return TypeName(m), nil
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
		return nil, fmt.Errorf("%w: as %s: %v", ErrUndecodable, typ, err)
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
		return fmt.Errorf("%w: as %s: %v", ErrUndecodable, TypeName(m), err)
	}
	return CheckIdentity(msg.Subject, m)
}

// CheckIdentity verifies that the identity fields of m (checker, voter,
// node, unit, ...) match the tokens of the subject it arrived on, so that a
// node cannot speak for another by lying in the payload.
func CheckIdentity(subject string, m proto.Message) error {
	mismatch := func(field, got, want string) error {
		return fmt.Errorf("%w: %s=%q but subject %q says %q", ErrIdentity, field, got, subject, want)
	}
	switch v := m.(type) {
	case *atollv1.ProbeReport:
		unit, checker, err := ParseProbeSubject(subject)
		if err != nil {
			return err
		}
		if v.GetChecker() != checker {
			return mismatch("checker", v.GetChecker(), checker)
		}
		if v.GetUnit() != unit {
			return mismatch("unit", v.GetUnit(), unit)
		}
	case *atollv1.Vote:
		unit, node, voter, err := ParseVoteSubject(subject)
		if err != nil {
			return err
		}
		if v.GetVoter() != voter {
			return mismatch("voter", v.GetVoter(), voter)
		}
		if v.GetNode() != node {
			return mismatch("node", v.GetNode(), node)
		}
		if v.GetUnit() != unit {
			return mismatch("unit", v.GetUnit(), unit)
		}
	case *atollv1.TopologyUpdate:
		node, err := ParseTopologySubject(subject)
		if err != nil {
			return err
		}
		if v.GetNode() != node {
			return mismatch("node", v.GetNode(), node)
		}
	case *atollv1.TunnelFrame:
		_, session, _, err := ParseTunnelSubject(subject)
		if err != nil {
			return err
		}
		if v.GetSession() != session {
			return mismatch("session", v.GetSession(), session)
		}
	case *atollv1.UnitView:
		k, err := ParseViewSubject(subject)
		if err != nil {
			return err
		}
		if v.GetUnit() != k.Unit {
			return mismatch("unit", v.GetUnit(), k.Unit)
		}
	case *atollv1.HostRecords:
		k, err := ParseViewSubject(subject)
		if err != nil {
			return err
		}
		if v.GetUnit() != k.Unit {
			return mismatch("unit", v.GetUnit(), k.Unit)
		}
	case *atollv1.NodeAssignment:
		k, err := ParseViewSubject(subject)
		if err != nil {
			return err
		}
		if k.Unit != NoUnit || k.Kind != KindAssignment {
			return fmt.Errorf("%w: %q is not an assignment subject", ErrWrongSubject, subject)
		}
		if v.GetNode() != k.Name {
			return mismatch("node", v.GetNode(), k.Name)
		}
	case *atollv1.ObjectView:
		k, err := ParseViewSubject(subject)
		if err != nil {
			return err
		}
		if v.GetKind() != k.Kind || v.GetName() != k.Name {
			return mismatch("kind/name", v.GetKind()+"/"+v.GetName(), k.Kind+"/"+k.Name)
		}
	}
	return nil
}
