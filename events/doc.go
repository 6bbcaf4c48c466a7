// Package events is Atoll's event layer on NATS: everything on the wire.
//
// The catalog (catalog.go) is a table with one Family per subject family:
// its pattern with named tokens, how it travels (a hub stream, core NATS,
// or request/reply to a micro endpoint), the protobuf type it carries, the
// payload fields that must agree with the subject, the Nats-Msg-Id rule,
// and who produces and consumes it. The hub streams' subjects (Streams),
// the subject builders and parsers (BallotSubject, ParseBallotSubject, ...),
// CheckIdentity, TypeForSubject (`atoll decode`) and the README's subject
// catalog (CatalogMarkdown, `atoll events catalog`) are derived from it;
// tests fail when they disagree.
//
// Every message carries Content-Type: application/protobuf and Atoll-Type
// with the message's full protobuf name, so any tool can decode it; stream
// messages carry Nats-Msg-Id for JetStream dedupe.
//
// Reading a stream is one API, Consume (or NewConsumer and Run), with one
// contract whether the ConsumerSpec is Shared (a durable consumer whose
// messages replicas share) or Follow (every process gets every message):
// handler errors are retried with backoff, the MaxDeliver-th failure ends
// the message in a counted, logged terminal state, a lost consumer is
// recreated, and no consumer stops before its context is done without an
// ERROR log line and a metric. Consumer.CaughtUp reports when the backlog
// present at start has been handled, for readiness. Subscribe reads core
// NATS subjects through the same decode, terminal-state and metrics path.
//
// LastValue keeps one value per subject on a stream that holds each
// subject's last message (the VIEWS stream): it stores a message only when
// its fingerprint differs from the subject's stored one, under the msg-id
// rule <subject>@<fingerprint>@<sequence replaced> and expecting that last
// subject sequence, reading the stream again after a conflict and
// checking Duplicate acks, so writers can run active-active.
//
// Request/reply endpoints are nats.go micro services (CloudService);
// Endpoint adapts a typed handler and Request is the typed client, with
// errors as micro's Nats-Service-Error headers (ServiceError).
package events
