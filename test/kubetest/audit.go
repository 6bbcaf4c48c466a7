package kubetest

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// auditPolicy records every write to Nodes (with the stored object),
// Endpoints and EndpointSlices once, when its response is complete; %s is
// where the rules for Audit's users go. Watches (long-running) are also
// logged when their response starts, so a watch is seen while it runs.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "Panic"]
rules:
- level: RequestResponse
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: ""
    resources: ["nodes"]
- level: Metadata
  verbs: ["create", "update", "patch", "delete"]
  resources:
  - group: ""
    resources: ["endpoints"]
  - group: "discovery.k8s.io"
    resources: ["endpointslices"]
%s- level: None
`

// Audit writes an audit policy into dir and returns the kube-apiserver
// flags that log the writes to Nodes, Endpoints and EndpointSlices to
// AuditLog(dir), synchronously (pass them to WithAPIServerFlags). Every
// request of users (e.g. a ServiceAccount's
// "system:serviceaccount:<ns>:<name>") is also logged, at Metadata level:
// who did what to which object, and the response code, so a test can list
// what an identity used and what it was refused.
func Audit(dir string, users ...string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var byUser string
	if len(users) > 0 {
		quoted := make([]string, len(users))
		for i, u := range users {
			quoted[i] = strconv.Quote(u)
		}
		byUser = fmt.Sprintf("- level: Metadata\n  users: [%s]\n", strings.Join(quoted, ", "))
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, fmt.Appendf(nil, auditPolicy, byUser), 0o600); err != nil {
		return nil, err
	}
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + AuditLog(dir),
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}, nil
}

// AuditLog is the audit log's path for Audit(dir).
func AuditLog(dir string) string { return filepath.Join(dir, "audit.log") }

// AuditEvent is the part of an audit event the tests read.
type AuditEvent struct {
	// Received is when the apiserver received the request.
	Received   time.Time `json:"requestReceivedTimestamp"`
	Verb       string    `json:"verb"`
	RequestURI string    `json:"requestURI"`
	UserAgent  string    `json:"userAgent"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		APIGroup    string `json:"apiGroup"`
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	// ResponseObject is the stored object (Nodes only).
	ResponseObject json.RawMessage `json:"responseObject"`
}

// FieldManager is the fieldManager query parameter of the request.
func (e AuditEvent) FieldManager() string {
	u, err := url.Parse(e.RequestURI)
	if err != nil {
		return ""
	}
	return u.Query().Get("fieldManager")
}

// Object is resource/namespace/name.
func (e AuditEvent) Object() string {
	return fmt.Sprintf("%s/%s/%s", e.ObjectRef.Resource, e.ObjectRef.Namespace, e.ObjectRef.Name)
}

// ReadAudit parses an audit log (none yet: no events).
func ReadAudit(path string) ([]AuditEvent, error) {
	f, err := os.Open(filepath.Clean(path))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []AuditEvent
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		var e AuditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			continue // a line being written
		}
		out = append(out, e)
	}
	return out, sc.Err()
}

// Writes counts the successful writes (2xx) of fieldManager by object.
func Writes(events []AuditEvent, fieldManager string) map[string]int {
	out := map[string]int{}
	for _, e := range events {
		if e.FieldManager() == fieldManager && e.ResponseStatus.Code >= 200 && e.ResponseStatus.Code < 300 {
			out[e.Object()]++
		}
	}
	return out
}
