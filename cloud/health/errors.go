package health

import "errors"

// ErrBallotRejected marks a ballot the cloud will not count: its TTL or its
// timestamp is out of bounds. The consumer terminates it with the reason
// and counts it (atoll_events_terminated_total{reason="rejected"}).
var ErrBallotRejected = errors.New("ballot rejected")
