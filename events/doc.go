// Package events is Atoll's event layer on NATS: the one subject catalog,
// the JetStream stream and consumer definitions, and typed publishing and
// consuming of the protobuf messages in schemas/atoll/v1.
//
// Every message carries three headers: Nats-Msg-Id (JetStream dedupe),
// Content-Type: application/protobuf, and Atoll-Type with the message's full
// protobuf name, so any tool can decode it (see `atoll decode`).
package events
