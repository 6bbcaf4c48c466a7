package viewfeed

import (
	"errors"
	"time"
)

// Config tunes every feed of an agent.
type Config struct {
	// CheckPeriod is how often a feed catches up even when nothing told
	// it to: the safety net for a loss nothing else reveals (the first
	// message of a new subject lost, and nothing after it on the same
	// subject). Each catch-up is a few requests to the hub and a
	// consumer that lives CatchUpLinger.
	CheckPeriod time.Duration
	// VerifyEvery makes every n-th periodic check a full catch-up (a
	// stream info, and a consumer when the space changed since the last
	// one): the net for a stream rebuilt while nothing is republished and
	// for a lost view another one heard later hides. The other checks
	// read only the space's last view.
	VerifyEvery int
	// CatchUpLinger is the InactiveThreshold of a catch-up's consumer:
	// how long the hub keeps it after its last request. The edge may not
	// delete consumers, so this is how they go.
	CatchUpLinger time.Duration
	// Buffer is how many republished views may wait while a catch-up
	// runs (or the handler is slow); one more is a slow consumer, which
	// costs a catch-up.
	Buffer int
	// MaxUnverified bounds the sequences applied from the republished
	// views since the last catch-up, which gap detection remembers;
	// reaching it runs a catch-up, which forgets them.
	MaxUnverified int
	// Batch is how many views a catch-up asks for at a time.
	Batch int
	// LeafPoll is how often a feed looks for a reconnect of the leaf
	// link and for views its subscription dropped: how late, at most,
	// the catch-up after a leaf reconnect starts.
	LeafPoll time.Duration
}

// DefaultCheckPeriod is 5 minutes: every agent pays it at the hub.
const DefaultCheckPeriod = 5 * time.Minute

// DefaultConfig suits production.
func DefaultConfig() Config {
	return Config{
		CheckPeriod:   DefaultCheckPeriod,
		VerifyEvery:   12,
		CatchUpLinger: 15 * time.Second,
		Buffer:        8192,
		MaxUnverified: 4096,
		Batch:         256,
		LeafPoll:      250 * time.Millisecond,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.CheckPeriod <= 0:
		return errors.New("viewfeed: CheckPeriod must be positive")
	case c.VerifyEvery < 1:
		return errors.New("viewfeed: VerifyEvery must be at least 1")
	case c.CatchUpLinger < time.Second:
		return errors.New("viewfeed: CatchUpLinger must be at least 1s")
	case c.Buffer < 1:
		return errors.New("viewfeed: Buffer must be positive")
	case c.MaxUnverified < 1:
		return errors.New("viewfeed: MaxUnverified must be positive")
	case c.Batch < 1:
		return errors.New("viewfeed: Batch must be positive")
	case c.LeafPoll <= 0:
		return errors.New("viewfeed: LeafPoll must be positive")
	}
	return nil
}
