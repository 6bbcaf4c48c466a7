// Package events is Atoll's wire contract on NATS: what travels, where,
// and how it is encoded. It holds no consumer, no connection and no
// state.
//
// The catalog (catalog.go) is a table with one Family per subject family:
// its pattern with named tokens, how it travels (a hub stream, core NATS,
// or request/reply to a micro endpoint), the protobuf type it carries, the
// payload fields that must agree with the subject, the Nats-Msg-Id rule,
// and who produces and consumes it. The hub streams' subjects (Streams),
// the subject builders and parsers (BallotSubject, ParseBallotSubject, ...),
// CheckIdentity, TypeForSubject (`atoll decode`) and the subject catalog
// (CatalogMarkdown, `atoll events catalog`, docs/reference/subjects.md)
// are derived from it; tests fail when they disagree.
//
// Every message carries Content-Type: application/protobuf and Atoll-Type
// with the message's full protobuf name, so any tool can decode it
// (message.go); stream messages carry Nats-Msg-Id for JetStream dedupe.
// Publish, PublishDurable and PublishAsync check a payload's identity
// against its subject before sending it; probe reports are signed with
// the node's key (signature.go).
//
// The streams (StreamDefs, Streams) and the consumers of Atoll's services
// (ConsumerSpec: BallotConsumer, BallotFollower, ...) are declared here,
// so the full set is visible in one place; internal/eventbus runs them.
//
// Request/reply endpoints are nats.go micro services (CloudService);
// Endpoint adapts a typed handler and Request is the typed client, with
// errors as micro's Nats-Service-Error headers (ServiceError).
package events
