package chaos

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Plan is what the driver tells the checker before the schedule starts:
// the schedule, where to find the installation's parts from the outside,
// and the bounds the invariants hold to.
type Plan struct {
	Schedule Schedule `json:"schedule"`
	// Kubeconfig is an admin kubeconfig of the cluster.
	Kubeconfig string `json:"kubeconfig"`
	// Net is the node fleet's network (kubenode.InFleet).
	Net int `json:"net"`
	// Disks are each node's disk by node name (cloud nodes too): its
	// container logs are under host/var/log/pods.
	Disks map[string]string `json:"disks"`
	// Agents are each edge node's atoll-edge admin address (host:port),
	// AdminToken the bearer token its /metrics asks for.
	Agents     map[string]string `json:"agents"`
	AdminToken string            `json:"adminToken"`
	// AuditLog is kube-apiserver's audit log (atoll-cloud's requests).
	AuditLog string `json:"auditLog"`
	// CloudUser is atoll-cloud's user name in the audit log.
	CloudUser string `json:"cloudUser"`
	// Namespace holds the workload.
	Namespace string `json:"namespace"`
	// HubSelector selects the pods of HubNamespace that run the hub's
	// servers, whose nats-server monitoring is on HubMonitorPort (empty:
	// the hub is not watched).
	HubSelector    string `json:"hubSelector,omitempty"`
	HubNamespace   string `json:"hubNamespace,omitempty"`
	HubMonitorPort string `json:"hubMonitorPort,omitempty"`
	// Grace is KCM's node monitor grace period; Toleration the
	// workload's tolerationSeconds for unreachable and not-ready.
	Grace      time.Duration `json:"grace"`
	Toleration time.Duration `json:"toleration"`
}

// Bounds the invariants hold to.
const (
	// TaintBound is how long a protected node may carry
	// unreachable:NoExecute (docs/health.md: 5 s through any failure of
	// atoll-cloud).
	TaintBound = 5 * time.Second
	// DeadTaintBound is how long after KCM's grace a dead node may wait
	// for its NoExecute taint.
	DeadTaintBound = 40 * time.Second
	// ViewsBound is how long an agent's view feed may stay behind (a
	// catch-up due and not done) while it is linked.
	ViewsBound = time.Minute
	// EvictBound is how long after its toleration a dead node's pod may
	// wait to be deleted.
	EvictBound = 30 * time.Second
)

// Files of a run's directory.
const (
	PlanFile       = "plan.json"
	JournalFile    = "journal.jsonl"
	ViolationsFile = "violations.jsonl"
	SamplesFile    = "samples.jsonl"
	ReportFile     = "report.html"
	SummaryFile    = "summary.md"
)

// WritePlan writes p into dir.
func WritePlan(dir string, p Plan) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, PlanFile), b, 0o600)
}

// ReadPlan reads the plan of dir.
func ReadPlan(dir string) (Plan, error) {
	var p Plan
	b, err := os.ReadFile(filepath.Join(dir, PlanFile))
	if err != nil {
		return p, fmt.Errorf("chaos: plan: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("chaos: plan %s: %w", filepath.Join(dir, PlanFile), err)
	}
	return p, nil
}
