// Package eventbus runs what the wire contract (package events)
// declares: the consumers of the hub's streams, the last-value protocol of
// the VIEWS stream and the streams themselves.
//
// Reading a stream is one API, Consume (or NewConsumer and Run), with one
// contract whether the events.ConsumerSpec is Shared (a durable consumer
// whose messages replicas share) or Follow (every process gets every
// message): handler errors are retried with backoff, the MaxDeliver-th
// failure ends the message in a counted, logged terminal state, a lost
// consumer is recreated, and no consumer stops before its context is done
// without an ERROR log line and a metric. Consumer.CaughtUp reports when
// the backlog present at start has been handled, for readiness. Subscribe
// reads core NATS subjects through the same decode, terminal-state and
// metrics path.
//
// LastValue keeps one value per subject on a stream that holds each
// subject's last message (the VIEWS stream): it stores a message only when
// its fingerprint differs from the subject's stored one, under the msg-id
// rule <subject>@<fingerprint>@<sequence replaced> and expecting that last
// subject sequence, reading the stream again after a conflict and
// checking Duplicate acks, so writers can run active-active.
//
// ReconcileStreams (and EnsureStreams) bring the hub's streams to their
// declared configuration at every start, from every replica.
package eventbus
