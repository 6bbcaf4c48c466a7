package eventbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/atoll-edge/atoll/events"
)

// Fingerprinted is a message that carries a fingerprint of its content:
// a hash of everything but its time and the fingerprint itself, so that
// two messages with the same fingerprint say the same thing.
type Fingerprinted interface {
	proto.Message
	GetFingerprint() string
}

// Stored is a subject's last value on a stream, as a LastValue last saw it.
type Stored struct {
	// Fingerprint of the stored message; "" when the subject holds
	// nothing or a message that does not decode.
	Fingerprint string
	// Seq is the message's stream sequence; 0 when the subject holds
	// nothing.
	Seq uint64
	// Time is when it was stored: the stream's time when read, the time
	// of the acknowledgement when this LastValue stored it.
	Time time.Time
	// Empty says the value stands for nothing (LastValueOptions.Empty).
	Empty bool
}

// PutResult says what one LastValue.Put did, for the caller's metrics
// and logs. It is filled in on errors too.
type PutResult struct {
	// Changed: the message was stored (the subject held other content).
	Changed bool
	// Replaced is the subject's value the last comparison was made with:
	// the one the stored message replaced when Changed, else the one that
	// already held the content.
	Replaced Stored
	// Remembered: the first comparison used what the LastValue
	// remembered of the subject, without reading the stream.
	Remembered bool
	// Conflicts counts publishes refused because the subject's last
	// sequence was not the one expected (another writer stored a value,
	// or the stream lost one); each was followed by a read of the stream.
	Conflicts int
	// Republished counts Duplicate acks for a copy the stream no longer
	// holds as the subject's value, after which the message was
	// published again.
	Republished int
	// Seq and Bytes are the stream sequence and size of the message
	// stored (0 when not Changed).
	Seq   uint64
	Bytes int
	// PublishFailed: the error is a publish's (not a read of the stream,
	// nor a subject that kept changing).
	PublishFailed bool
}

// ErrKeptChanging says a LastValue.Put gave up because every publish found
// another value stored under it.
var ErrKeptChanging = errors.New("the stored value kept changing")

// LastValueOptions tune a LastValue.
type LastValueOptions[T Fingerprinted] struct {
	// Stamp returns the message to publish for m, e.g. a copy with its
	// time set; it is called before each publish, never when nothing is
	// stored. nil: m is published as it is.
	Stamp func(m T) T
	// Empty reports whether m stands for nothing (a tombstone, an empty
	// set). An empty message is not stored on a subject that holds
	// nothing, and Stored.Empty marks empty stored values. nil: none is.
	Empty func(m T) bool
	// MaxAttempts bounds the publishes of one Put (default
	// DefaultLastValueAttempts).
	MaxAttempts int
	// Signer, when set, signs every message published (header
	// Atoll-Signature, events.SignMsg).
	Signer events.Signer
}

// DefaultLastValueAttempts bounds the publishes of one LastValue.Put: a
// subject that keeps changing under them is left to the caller's next
// pass.
const DefaultLastValueAttempts = 5

// LastValue keeps one value per subject on a stream that holds the last
// message of each subject (MaxMsgsPerSubject 1, like StreamViews), for
// writers that run active-active and may restart, reconnect or find the
// stream purged. Put makes a message the subject's last value unless the
// stream already holds its content:
//
//   - The fingerprints are compared: with what the LastValue remembers of
//     the subject, else with the subject's last message, read from the
//     stream (get-last-message-for-subject). Equal content stores nothing.
//   - The message id is <subject>@<fingerprint>@<sequence it replaces>
//     (the Family.MsgID of such subjects), so writers making the same
//     change collapse into one message, and a value that goes A → B → A
//     stores A again (it replaces B, not nothing).
//   - The publish expects the subject's last sequence to be the one
//     compared with (Nats-Expected-Last-Subject-Sequence): a value stored
//     meanwhile by another writer, or lost by the stream, fails it with a
//     wrong-last-sequence error, and Put reads the stream and decides
//     again.
//   - A Duplicate ack is checked against the stream: when the subject's
//     last value is not this content (the id matched an earlier copy that
//     was since replaced or purged), Put decides again, and when the id
//     would collide again it adds a one-off token to it.
//   - At most MaxAttempts publishes are made; then Put returns
//     ErrKeptChanging.
//
// What was stored or read is remembered per subject, so a Put of
// unchanged content costs no round trip; Forget and ForgetAll make the
// next Puts read the stream again (a resync). A failed Put forgets its
// subject. A LastValue is safe for concurrent use.
type LastValue[T Fingerprinted] struct {
	js     func() jetstream.JetStream
	stream string
	opts   LastValueOptions[T]
	typ    protoreflect.MessageType // of T, to decode stored messages

	smu sync.Mutex
	st  jetstream.Stream // stream, once looked up

	mu    sync.Mutex
	known map[string]Stored
}

// NewLastValue returns a LastValue keeping the last values of subjects of
// stream. js returns the JetStream to use; it is called when the stream
// is first needed, so it may be (*hublink.Link).JetStream before the link
// starts. T is a generated message type (a pointer, such as
// *atollv1.UnitView): stored messages are decoded as T.
func NewLastValue[T Fingerprinted](js func() jetstream.JetStream, stream string, o LastValueOptions[T]) *LastValue[T] {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultLastValueAttempts
	}
	var zero T
	return &LastValue[T]{js: js, stream: stream, opts: o, typ: zero.ProtoReflect().Type(), known: map[string]Stored{}}
}

// Put makes m, with fingerprint m.GetFingerprint(), the last value stored
// on subj, unless the stream already holds that content there (or m is
// empty and the subject holds nothing). See LastValue for the rules. A
// message without a fingerprint is an error.
func (lv *LastValue[T]) Put(ctx context.Context, subj string, m T) (PutResult, error) {
	var res PutResult
	fp := m.GetFingerprint()
	if fp == "" {
		// "" is also the fingerprint of nothing stored.
		return res, fmt.Errorf("events: put %s: %s has no fingerprint", subj, events.TypeName(m))
	}
	last, known := lv.Known(subj)
	res.Remembered = known
	nonce := ""
	for attempt := 1; ; attempt++ {
		if !known {
			var err error
			if last, err = lv.read(ctx, subj); err != nil {
				lv.Forget(subj)
				return res, err
			}
		}
		res.Replaced = last
		if last.Fingerprint == fp || (last.Seq == 0 && lv.empty(m)) {
			lv.remember(subj, last)
			return res, nil
		}
		if attempt > lv.opts.MaxAttempts {
			lv.Forget(subj)
			return res, fmt.Errorf("events: %s: %w under %d attempts", subj, ErrKeptChanging, lv.opts.MaxAttempts)
		}
		msg := m
		if lv.opts.Stamp != nil {
			msg = lv.opts.Stamp(m)
		}
		js := lv.js()
		if js == nil {
			return res, fmt.Errorf("events: publish %s: not connected", subj)
		}
		id := subj + "@" + fp + "@" + strconv.FormatUint(last.Seq, 10) + nonce
		ack, err := events.PublishDurableSigned(ctx, js, subj, msg, id, lv.opts.Signer, jetstream.WithExpectLastSequencePerSubject(last.Seq))
		if IsWrongLastSequence(err) {
			// Another writer stored a value, or the stream lost one:
			// read what it holds and decide again.
			res.Conflicts++
			known = false
			continue
		}
		if err != nil {
			lv.Forget(subj)
			res.PublishFailed = true
			return res, err
		}
		if ack.Duplicate {
			now, err := lv.read(ctx, subj)
			if err != nil {
				lv.Forget(subj)
				return res, err
			}
			if now.Fingerprint != fp {
				// The id matched an earlier copy that is no longer the
				// subject's value: nothing was stored.
				res.Republished++
				if now.Seq == last.Seq {
					var raw [8]byte
					_, _ = rand.Read(raw[:])
					nonce = "@" + hex.EncodeToString(raw[:])
				}
				last, known = now, true
				continue
			}
			ack.Sequence = now.Seq
		}
		lv.remember(subj, Stored{Fingerprint: fp, Seq: ack.Sequence, Time: time.Now(), Empty: lv.empty(m)})
		res.Changed, res.Seq = true, ack.Sequence
		res.Bytes = proto.Size(msg)
		return res, nil
	}
}

// Last is the subject's last value: as remembered, else read from the
// stream (and remembered).
func (lv *LastValue[T]) Last(ctx context.Context, subj string) (Stored, error) {
	if st, ok := lv.Known(subj); ok {
		return st, nil
	}
	st, err := lv.read(ctx, subj)
	if err != nil {
		return Stored{}, err
	}
	lv.remember(subj, st)
	return st, nil
}

// Known is what is remembered of the subject's last value, without a
// read; false when nothing is.
func (lv *LastValue[T]) Known(subj string) (Stored, bool) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	st, ok := lv.known[subj]
	return st, ok
}

// Forget drops what is remembered of subj: the next Put reads the stream.
func (lv *LastValue[T]) Forget(subj string) {
	lv.mu.Lock()
	delete(lv.known, subj)
	lv.mu.Unlock()
}

// ForgetAll drops what is remembered of every subject, so that every
// next Put compares with the stream, and returns it.
func (lv *LastValue[T]) ForgetAll() map[string]Stored {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	was := lv.known
	lv.known = map[string]Stored{}
	return was
}

func (lv *LastValue[T]) remember(subj string, st Stored) {
	lv.mu.Lock()
	lv.known[subj] = st
	lv.mu.Unlock()
}

func (lv *LastValue[T]) empty(m T) bool { return lv.opts.Empty != nil && lv.opts.Empty(m) }

// read reads the last message the stream holds on subj. A subject with no
// message is the zero Stored; a message that does not decode as a T has
// an empty fingerprint, so it is replaced.
func (lv *LastValue[T]) read(ctx context.Context, subj string) (Stored, error) {
	st, err := lv.streamHandle(ctx)
	if err != nil {
		return Stored{}, err
	}
	raw, err := st.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Stored{}, nil
	}
	if err != nil {
		return Stored{}, fmt.Errorf("events: last value of %s: %w", subj, err)
	}
	m, ok := lv.typ.New().Interface().(T)
	if !ok || proto.Unmarshal(raw.Data, m) != nil {
		return Stored{Seq: raw.Sequence, Time: raw.Time}, nil
	}
	return Stored{Fingerprint: m.GetFingerprint(), Seq: raw.Sequence, Time: raw.Time, Empty: lv.empty(m)}, nil
}

func (lv *LastValue[T]) streamHandle(ctx context.Context) (jetstream.Stream, error) {
	lv.smu.Lock()
	defer lv.smu.Unlock()
	if lv.st != nil {
		return lv.st, nil
	}
	js := lv.js()
	if js == nil {
		return nil, fmt.Errorf("events: stream %s: not connected", lv.stream)
	}
	st, err := js.Stream(ctx, lv.stream)
	if err != nil {
		return nil, fmt.Errorf("events: stream %s: %w", lv.stream, err)
	}
	lv.st = st
	return st, nil
}

// IsWrongLastSequence reports whether err is JetStream's answer to a
// publish whose expected last (subject) sequence was not the stream's.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}
