package tunnelproto

import "errors"

var (
	// ErrPeerLost: nothing was heard from the other end for LinkTimeout.
	ErrPeerLost = errors.New("tunnel: peer lost")
	// ErrIdle: no stream byte moved in either direction for IdleTimeout.
	ErrIdle = errors.New("tunnel: idle timeout")
	// ErrProtocol: the peer sent a frame the protocol forbids.
	ErrProtocol = errors.New("tunnel: protocol violation")
	// ErrAborted: this end aborted the session.
	ErrAborted = errors.New("tunnel: aborted")
	// ErrClosed: the Conn was closed by this end.
	ErrClosed = errors.New("tunnel: closed")
)

// PeerError is an ERROR frame's reason: the other end failed the session
// (a refused or undialable target, its own timeout, a protocol error).
type PeerError struct{ Reason string }

func (e *PeerError) Error() string { return "tunnel: peer: " + e.Reason }
