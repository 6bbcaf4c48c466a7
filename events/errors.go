package events

import "errors"

// Sentinel errors; match with errors.Is.
var (
	// ErrEmptyToken: a subject token (unit, node, session, ...) is empty.
	ErrEmptyToken = errors.New("empty subject token")
	// ErrInvalidToken: a subject token holds '.', '*', '>' or whitespace.
	ErrInvalidToken = errors.New("invalid subject token")
	// ErrWrongSubject: a subject does not have the catalog's shape.
	ErrWrongSubject = errors.New("subject not in catalog")
	// ErrUnknownType: the type header names no known Atoll message.
	ErrUnknownType = errors.New("unknown message type")
	// ErrTypeMismatch: the type header names another message than expected.
	ErrTypeMismatch = errors.New("message type mismatch")
	// ErrUndecodable: the payload does not decode as its declared type.
	ErrUndecodable = errors.New("undecodable payload")
	// ErrIdentity: the payload's identity fields disagree with its subject.
	ErrIdentity = errors.New("payload identity does not match subject")
	// ErrUnsigned: a message that must be signed carries no signature.
	ErrUnsigned = errors.New("message not signed")
	// ErrBadSignature: a message's signature is malformed or was not made
	// with its producer's key.
	ErrBadSignature = errors.New("bad message signature")
	// ErrNoKey: the producer's key, to verify its signature with, is not
	// known.
	ErrNoKey = errors.New("no key for the message's producer")
)

// emptyNameError is ErrEmptyToken for a token whose role the builder knows:
// its message says which name is missing ("events: node name is empty").
type emptyNameError struct{ role string }

func (e emptyNameError) Error() string { return "events: " + e.role + " is empty" }

// Is makes errors.Is(err, ErrEmptyToken) hold.
func (e emptyNameError) Is(target error) bool { return target == ErrEmptyToken }

// emptyName is the error for an empty value of the named token role
// (unit, node, voter, kind, ...).
func emptyName(role string) error {
	switch role {
	case "unit", "node", "voter", "checker", "session":
		role += " name"
	case "name":
		role = "object name"
	}
	return emptyNameError{role: role}
}
