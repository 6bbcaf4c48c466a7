package objects

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// maxPutAttempts bounds the publishes of one view in one pass.
const maxPutAttempts = 5

// put makes v the last value stored on subj, unless it already is (same
// fingerprint), and says whether it stored it. The rules are those of the
// unit views (cloud/topology): the publish expects the subject's last sequence to be the one read, the
// message id is <subject>@<fingerprint>@<sequence it replaces>, and a
// Duplicate ack is checked against the stream.
func (p *Publisher) put(ctx context.Context, subj string, v *atollv1.ObjectView) (bool, error) {
	fp := v.GetFingerprint()
	p.mu.Lock()
	last, known := p.published[subj]
	p.mu.Unlock()
	nonce := ""
	for attempt := 1; ; attempt++ {
		if !known {
			var err error
			if last, err = p.stored(ctx, subj); err != nil {
				return false, err
			}
		}
		if last.fp == fp {
			p.remember(subj, last)
			return false, nil
		}
		if attempt > maxPutAttempts {
			p.forget(subj)
			return false, fmt.Errorf("objects: %s: the stored value kept changing under %d attempts", subj, maxPutAttempts)
		}
		m := proto.Clone(v).(*atollv1.ObjectView)
		m.Time = timestamppb.Now()
		id := subj + "@" + fp + "@" + strconv.FormatUint(last.seq, 10) + nonce
		ack, err := events.PublishDurable(ctx, p.js, subj, m, id, jetstream.WithExpectLastSequencePerSubject(last.seq))
		if isWrongLastSequence(err) {
			p.metrics.conflicts.Inc()
			known = false
			continue
		}
		if err != nil {
			p.forget(subj)
			p.metrics.rejected.WithLabelValues("publish_failed").Inc()
			return false, err
		}
		if ack.Duplicate {
			now, err := p.stored(ctx, subj)
			if err != nil {
				p.forget(subj)
				return false, err
			}
			if now.fp != fp {
				if now.seq == last.seq {
					var raw [8]byte
					_, _ = rand.Read(raw[:])
					nonce = "@" + hex.EncodeToString(raw[:])
				}
				last, known = now, true
				continue
			}
			ack.Sequence = now.seq
		}
		p.remember(subj, stored{fp: fp, seq: ack.Sequence, deleted: v.GetDeleted()})
		p.metrics.published.WithLabelValues(v.GetKind()).Inc()
		p.metrics.bytes.Add(float64(proto.Size(m)))
		return true, nil
	}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func (p *Publisher) remember(subj string, st stored) {
	p.mu.Lock()
	p.published[subj] = st
	p.mu.Unlock()
}

func (p *Publisher) forget(subj string) {
	p.mu.Lock()
	delete(p.published, subj)
	p.mu.Unlock()
}

// stored reads the last message the VIEWS stream holds on subj.
func (p *Publisher) stored(ctx context.Context, subj string) (stored, error) {
	if p.views == nil {
		st, err := p.js.Stream(ctx, events.StreamViews)
		if err != nil {
			return stored{}, fmt.Errorf("objects: stream %s: %w", events.StreamViews, err)
		}
		p.views = st
	}
	raw, err := p.views.GetLastMsgForSubject(ctx, subj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return stored{}, nil
	}
	if err != nil {
		return stored{}, fmt.Errorf("objects: last value of %s: %w", subj, err)
	}
	var v atollv1.ObjectView
	if err := proto.Unmarshal(raw.Data, &v); err != nil {
		return stored{seq: raw.Sequence}, nil
	}
	return stored{fp: v.GetFingerprint(), seq: raw.Sequence, deleted: v.GetDeleted()}, nil
}
