// Package tunnelproto is the session protocol of the cloud-to-edge
// tunnel: an ordered, lossless, flow-controlled byte stream carried as
// atollv1.TunnelFrame messages on core NATS subjects
// atoll.tunnel.<node>.<session>.<in|out>. The cloud tunnel server
// (cloud/tunnel) and the edge agent (edge/tunnel) both speak it.
//
// Session is the pure state machine (no goroutines, no clock: time is an
// argument), so it is tested by tables and fuzzing. Conn drives a Session
// as a net.Conn with one timer; Dialer (cloud) and Listener (edge) bind
// Conns to NATS subscriptions.
//
// Protocol, per direction: OPEN (sequence 1), DATA…, CLOSE are sequenced
// and kept until the peer's cumulative ack covers them, resent with a
// doubling delay (go-back-N: a receiver drops anything but the next
// expected sequence and re-acks). Every frame carries the sender's ack and
// its receive limit (an absolute stream offset), so duplicated, reordered
// or lost control frames never shrink credit. A sender never sends stream
// bytes beyond the peer's limit and buffers at most SendBuffer unframed
// bytes, so memory per session is bounded whatever the reader does. CLOSE
// is a half-close; ERROR (not sequenced) tears the session down and is
// also the answer to a frame for a session the receiver does not know.
// A session fails when nothing is heard from the peer for LinkTimeout
// (keepalives flow every KeepAlive), and optionally when no stream byte
// moves either way for IdleTimeout.
//
// When a node's own leaf link is down, a unit peer relays its sessions
// (README "Relay through a unit peer"): the Dialer changes a session's
// path when the node falls silent (RelayPolicy), the Listener answers on
// the path it last heard, and the peer's Relay forwards frames between
// its own hub namespace and the unit's routes, only to members of its
// unit.
package tunnelproto
