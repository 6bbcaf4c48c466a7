package voter

import (
	"errors"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// Reasons a probe report fails verification: the reason label of
// atoll_voter_reports_unverified_total.
const (
	reasonUnsigned     = "unsigned"      // no signature header
	reasonBadSignature = "bad_signature" // malformed, or not made with the checker's key
	reasonNoKey        = "no_key"        // the unit view publishes no key for the checker
)

// unverifiedWarnEvery is how often one (checker, reason) pair is logged.
const unverifiedWarnEvery = time.Minute

// receive takes a probe report as it arrived on the unit mesh: it counts
// only if signed by the key the unit view publishes for its checker (the
// subject's checker token, which the payload's checker matches:
// events.DecodeMsg). The routes of a unit are full trust, so without this
// any member could speak for another. A report from a checker that is not
// a member is left to Observe, which drops and counts it.
func (v *Voter) receive(ev eventbus.Event[*atollv1.ProbeReport]) {
	checker := ev.Msg.GetChecker()
	v.mu.Lock()
	key, member := v.keys[checker]
	v.mu.Unlock()
	if member {
		if err := events.Verify(ev.Subject, ev.Header, ev.Data, key); err != nil {
			v.unverified(checker, ev.Msg.GetUnit(), err)
			return
		}
	}
	v.Observe(ev.Msg)
}

// unverified drops a report that failed verification: counted by reason,
// logged at most once per checker and reason every unverifiedWarnEvery.
func (v *Voter) unverified(checker, unit string, err error) {
	reason := reasonBadSignature
	switch {
	case errors.Is(err, events.ErrUnsigned):
		reason = reasonUnsigned
	case errors.Is(err, events.ErrNoKey):
		reason = reasonNoKey
	}
	v.metrics.unverified.WithLabelValues(reason).Inc()
	if ok, suppressed := v.warns.allow(checker+"/"+reason, v.now()); ok {
		v.log.Warn("dropping probe reports that fail verification", "checker", checker, "unit", unit,
			"reason", reason, "err", err, "dropped_since_last_warning", suppressed)
	}
}

// limiter lets one event per key through every interval and counts the
// others.
type limiter struct {
	every time.Duration

	mu         sync.Mutex
	last       map[string]time.Time
	suppressed map[string]int
}

// maxLimiterKeys bounds the keys a limiter remembers.
const maxLimiterKeys = 1024

func newLimiter(every time.Duration) *limiter {
	return &limiter{every: every, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// allow reports whether key may log now, and how many of its events were
// held back since it last did.
func (l *limiter) allow(key string, now time.Time) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if last, ok := l.last[key]; ok && now.Sub(last) < l.every {
		l.suppressed[key]++
		return false, 0
	}
	if len(l.last) >= maxLimiterKeys {
		clear(l.last)
		clear(l.suppressed)
	}
	n := l.suppressed[key]
	l.last[key] = now
	delete(l.suppressed, key)
	return true, n
}
