package events

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"google.golang.org/protobuf/proto"
)

// Signed messages. Inside a unit the edge servers trust each other's
// routes completely, so a NATS server cannot stop node A from publishing a
// probe report on node B's subject over the unit mesh. What peers act on
// is therefore signed by its producer with the node's nkey (ed25519), and
// checked by the receiver against the key the cloud publishes for the
// claimed producer (UnitMember.node_key).
//
// The signature travels in the HeaderSignature header rather than in the
// payload: it covers the payload's exact bytes, so there is no canonical
// re-encoding to agree on (protobuf encoding is not canonical), the
// message types stay as they are, and every consumer that does not verify
// (the hub's stream, the cloud, `nats sub`) decodes the message unchanged.
//
// What is signed is SigningInput: a fixed context string, the subject and
// the payload. The subject binds the signature to where the message was
// published (a signed payload cannot be replayed on another producer's or
// unit's subject, even for a future message type without identity fields),
// and the context string separates these signatures from anything else
// the same key signs (the nonce of the node's leaf connection to the hub).
// A message can still be replayed on its own subject by a peer that saw
// it; receivers judge freshness on the content (the voter keeps only a
// checker's newest report within its freshness window).

// HeaderSignature carries the producer's ed25519 signature over
// SigningInput, base64url without padding.
const HeaderSignature = "Atoll-Signature"

// signatureContext starts every signing input.
const signatureContext = "atoll-signature-v1"

// maxSignatureHeader bounds the header before it is decoded: an ed25519
// signature is 64 bytes, 86 in base64url.
const maxSignatureHeader = 128

// Signer signs with a node's identity key; nkeys.KeyPair is one.
type Signer interface {
	Sign(input []byte) ([]byte, error)
}

// SigningInput is what a signature on subject covers: the context string,
// the subject and the payload, separated by NUL bytes (a subject holds
// none).
func SigningInput(subject string, payload []byte) []byte {
	b := make([]byte, 0, len(signatureContext)+len(subject)+len(payload)+2)
	b = append(b, signatureContext...)
	b = append(b, 0)
	b = append(b, subject...)
	b = append(b, 0)
	return append(b, payload...)
}

// SignMsg sets msg's signature header: s's signature over msg's subject
// and data.
func SignMsg(msg *nats.Msg, s Signer) error {
	sig, err := s.Sign(SigningInput(msg.Subject, msg.Data))
	if err != nil {
		return fmt.Errorf("sign %s: %w", msg.Subject, err)
	}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	msg.Header.Set(HeaderSignature, base64.RawURLEncoding.EncodeToString(sig))
	return nil
}

// Verify checks that header carries a valid signature of subject and
// payload by the holder of the nkey user public key pub. It fails with
// ErrNoKey when pub is empty (the producer's key is not known),
// ErrUnsigned when there is no signature, ErrBadSignature when the
// signature is malformed or does not verify; a pub that is no nkey user
// public key is ErrNoKey too.
func Verify(subject string, header nats.Header, payload []byte, pub string) error {
	return verify(subject, header, payload, pub, nkeys.IsValidPublicUserKey, "user")
}

// VerifyCloud is Verify for what the cloud signs with its account
// signing key (the issuer of every edge's user JWT): pub is an nkey
// account public key.
func VerifyCloud(subject string, header nats.Header, payload []byte, pub string) error {
	return verify(subject, header, payload, pub, nkeys.IsValidPublicAccountKey, "account")
}

func verify(subject string, header nats.Header, payload []byte, pub string, valid func(string) bool, kind string) error {
	if pub == "" {
		return ErrNoKey
	}
	enc := header.Get(HeaderSignature)
	if enc == "" {
		return ErrUnsigned
	}
	if len(enc) > maxSignatureHeader {
		return fmt.Errorf("%w: header of %d bytes", ErrBadSignature, len(enc))
	}
	// Strict: one signature has one encoding (no stray trailing bits).
	sig, err := base64.RawURLEncoding.Strict().DecodeString(enc)
	if err != nil {
		return fmt.Errorf("%w: encoding: %w", ErrBadSignature, err)
	}
	if !valid(pub) {
		return fmt.Errorf("%w: %q is not an nkey %s public key", ErrNoKey, pub, kind)
	}
	kp, err := nkeys.FromPublicKey(pub)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNoKey, err)
	}
	if err := kp.Verify(SigningInput(subject, payload), sig); err != nil {
		return ErrBadSignature
	}
	return nil
}

// PublishDurableSigned is PublishDurable with the message signed by s
// (see SignMsg); s nil publishes it unsigned.
func PublishDurableSigned[T proto.Message](ctx context.Context, js jetstream.JetStream, subject string, m T, id string, s Signer, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	msg, err := newCheckedMsg(subject, m, id)
	if err != nil {
		return nil, err
	}
	if s != nil {
		if err := SignMsg(msg, s); err != nil {
			return nil, err
		}
	}
	ack, err := js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", subject, err)
	}
	return ack, nil
}

// PublishSigned is Publish with the message signed by s (see SignMsg).
func PublishSigned[T proto.Message](nc *nats.Conn, subject string, m T, id string, s Signer) error {
	msg, err := newCheckedMsg(subject, m, id)
	if err != nil {
		return err
	}
	if err := SignMsg(msg, s); err != nil {
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}
