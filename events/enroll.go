package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nkeys"
)

// Enrollment: a node exchanges a one-time bootstrap token for its own
// credentials, and renews them with its current ones. JSON request/reply
// endpoints of atoll-cloud's identity service (micro service
// "atoll-identity"); the token's and the node's permissions allow exactly
// their own node's subject.

// EnrollPrefix starts the enrollment subjects.
const EnrollPrefix = Root + ".enroll."

// EnrollSubject is where node's bootstrap token asks for its credentials.
func EnrollSubject(node string) (string, error) {
	if err := ValidName(node); err != nil {
		return "", fmt.Errorf("enroll subject: node: %w", err)
	}
	return EnrollPrefix + Token(node), nil
}

// RenewSubject is where node's credentials ask for fresh ones.
func RenewSubject(node string) (string, error) {
	s, err := EnrollSubject(node)
	if err != nil {
		return "", err
	}
	return s + ".renew", nil
}

// EnrollRequest is what a node sends with its bootstrap token: the token
// (the user JWT it connected with) and the public key of the nkey it
// generated itself (its seed never leaves the node).
type EnrollRequest struct {
	Token string `json:"token"`
	Key   string `json:"key"`
}

// RenewRequest is what a node sends with its current credentials to get
// fresh ones for the same key.
type RenewRequest struct {
	Key string `json:"key"`
}

// EnrollReply carries the node's user JWT.
type EnrollReply struct {
	Node string `json:"node"`
	JWT  string `json:"jwt"`
}

// maxEnrollRequest bounds an enrollment request (a JWT and a key).
const maxEnrollRequest = 16 << 10

// DecodeEnrollRequest decodes and checks the shape of an enrollment
// request (not the token's validity): one JSON object, no unknown fields,
// a user public key and a token of sane size.
func DecodeEnrollRequest(data []byte) (EnrollRequest, error) {
	var req EnrollRequest
	if err := DecodeJSON(data, maxEnrollRequest, &req); err != nil {
		return EnrollRequest{}, fmt.Errorf("enroll request: %w", err)
	}
	if !nkeys.IsValidPublicUserKey(req.Key) {
		return EnrollRequest{}, errors.New("enroll request: key is not an nkey user public key")
	}
	if req.Token == "" || strings.Count(req.Token, ".") != 2 {
		return EnrollRequest{}, errors.New("enroll request: token is not a JWT")
	}
	return req, nil
}

// DecodeJSON decodes exactly one JSON object of at most limit bytes into
// v, refusing unknown fields.
func DecodeJSON(data []byte, limit int, v any) error {
	if len(data) > limit {
		return fmt.Errorf("%d bytes, more than %d", len(data), limit)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Kubernetes enrollment: an atoll-edge pod proves which node it runs on
// with its pod-bound ServiceAccount token. It links to the hub with the
// installation's shared enrollment credentials (which may only send these
// requests and hear their replies) and sends an EnrollRequest whose Token
// is the ServiceAccount token.

// EnrollKubernetesSubject is where node's pod asks for its credentials
// with its ServiceAccount token.
func EnrollKubernetesSubject(node string) (string, error) {
	s, err := EnrollSubject(node)
	if err != nil {
		return "", err
	}
	return s + ".k8s", nil
}

// EnrollKubernetesWildcard matches every EnrollKubernetesSubject.
const EnrollKubernetesWildcard = EnrollPrefix + "*.k8s"

// EnrollInboxPrefix is the reply inbox prefix of node's Kubernetes
// enrollment request: the shared enrollment credentials hear only
// replies under EnrollInboxPrefix("*") (credentials, which are useless
// without the key each node keeps), never a node's own inbox.
func EnrollInboxPrefix(node string) string { return "_INBOX_enroll." + Token(node) }
