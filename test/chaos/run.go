package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/atoll-edge/atoll/test/podbed"
	"github.com/atoll-edge/atoll/test/poll"
)

// Options shape a soak.
type Options struct {
	Dir      string
	Seed     uint64
	Duration time.Duration
	// Shape is ShapeEmbedded or ShapeCluster.
	Shape string
	// Units and Nodes: Units units of Nodes real nodes each.
	Units, Nodes int
	// Net is the node fleet's network (kubenode.Config.Net).
	Net int
	// Warmup runs the installation without faults before the schedule.
	Warmup time.Duration
	// Sabotage breaks the installation on purpose once the workload
	// runs, to show the checker catches it: SabotageNoAgents deletes the
	// atoll-edge DaemonSet, so no peer votes for a node cut off.
	Sabotage string
	// Checker is the command line that runs the checker on Dir: the
	// checker is a process of its own.
	Checker []string
	Logger  *slog.Logger
}

// StateDiskSize is the size of each node's /var/lib/atoll (DiskFull
// fills it): room for its state many times over.
const StateDiskSize = "64m"

// SabotageNoAgents is Options.Sabotage's one way to break Atoll.
const SabotageNoAgents = "no-agents"

// agentAdminPort is atoll-edge's admin port in deploy/base/atoll-edge.yaml.
const agentAdminPort = "9470"

// Workload is where the soak's workload runs.
const Workload = "soak"

// toleration is the workload's tolerationSeconds for unreachable and
// not-ready: a dead node's pods go within it.
const toleration = 30 * time.Second

// Topo is the topology of o: units a, b, … of nodes edge-a1, edge-a2, ….
func (o Options) Topo() Topology {
	t := Topology{Units: map[string][]string{}, Shape: o.Shape}
	for u := range o.Units {
		name := string(rune('a' + u))
		for n := range o.Nodes {
			t.Units[name] = append(t.Units[name], fmt.Sprintf("edge-%s%d", name, n+1))
		}
	}
	return t
}

// Soak installs Atoll on real nodes, runs the workload, starts the
// checker, plays the schedule and returns the checker's result: an error
// when an invariant was broken or the run could not be made.
func Soak(ctx context.Context, o Options) (Result, error) {
	log := o.Logger
	s := MakeSchedule(o.Seed, o.Duration, o.Topo())
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return Result{}, err
	}
	shape := podbed.ShapeEmbedded
	if o.Shape == ShapeCluster {
		shape = podbed.ShapeHA
	}
	begin := time.Now()
	bed, err := podbed.Start(ctx, podbed.Options{Net: o.Net, Dir: filepath.Join(o.Dir, "bed"), Units: s.Topology.Units,
		Shape: shape, Autonomy: true, Audit: true, StateDiskSize: StateDiskSize, HubMonitor: true, Logger: log})
	if bed != nil {
		defer func() {
			if err := bed.Stop(); err != nil {
				log.Error("chaos: stop", "err", err)
			}
		}()
	}
	if err != nil {
		if bed != nil {
			log.Error("chaos: install failed", "diagnostics", bed.Diagnostics())
		}
		return Result{}, err
	}
	log.Info("chaos: installed", "after", time.Since(begin).Round(time.Second))
	if err := bed.Apply(ctx, workload(bed.Fleet.Image("hello"), o.Nodes)); err != nil {
		return Result{}, err
	}
	if err := waitWorkload(ctx, bed, o.Units*(o.Nodes+2)); err != nil {
		return Result{}, err
	}
	log.Info("chaos: workload ready", "after", time.Since(begin).Round(time.Second))
	if o.Sabotage == SabotageNoAgents {
		if _, err := bed.Kubectl(ctx, "-n", podbed.Namespace, "delete", "daemonset", "atoll-edge", "--wait"); err != nil {
			return Result{}, err
		}
		log.Warn("chaos: sabotaged: every atoll-edge deleted")
	}

	plan := Plan{Schedule: s, Kubeconfig: bed.Cluster.KubeconfigPath(), Net: o.Net, Disks: map[string]string{},
		AuditLog: bed.AuditLog(), CloudUser: "system:serviceaccount:" + podbed.Namespace + ":atoll-cloud",
		Namespace: Workload, Grace: 20 * time.Second, Toleration: toleration,
		HubNamespace: podbed.Namespace, HubMonitorPort: podbed.HubMonitorPort, HubSelector: "app.kubernetes.io/name=atoll-cloud"}
	if shape == podbed.ShapeHA {
		plan.HubSelector = "app.kubernetes.io/name=atoll-hub"
	}
	for _, n := range bed.Fleet.Nodes() {
		plan.Disks[n.Name] = n.Disk
	}
	plan.Agents, plan.AdminToken = map[string]string{}, podbed.AdminToken
	for name, n := range bed.Edges {
		plan.Agents[name] = net.JoinHostPort(n.IP, agentAdminPort)
	}
	if err := WritePlan(o.Dir, plan); err != nil {
		return Result{}, err
	}
	journal, err := CreateJournal(filepath.Join(o.Dir, JournalFile))
	if err != nil {
		return Result{}, err
	}
	defer journal.Close()
	checker, err := startChecker(o)
	if err != nil {
		return Result{}, err
	}
	defer func() { _ = syscall.Kill(-checker.Process.Pid, syscall.SIGKILL) }()
	log.Info("chaos: warming up", "for", o.Warmup)
	select {
	case <-ctx.Done():
		return Result{}, ctx.Err()
	case <-time.After(o.Warmup):
	}
	faultErr := NewInjector(bed, journal, log).Run(ctx, s)
	if faultErr != nil {
		log.Error("chaos: faults that could not be made", "err", faultErr)
	}
	wait := make(chan error, 1)
	go func() { wait <- checker.Wait() }()
	select {
	case err = <-wait:
	case <-time.After(2 * time.Minute):
		_ = syscall.Kill(-checker.Process.Pid, syscall.SIGTERM)
		err = errors.Join(errors.New("the checker did not end within 2 minutes of the schedule"), <-wait)
	}
	if err != nil {
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != ExitViolations {
			return Result{}, fmt.Errorf("chaos: checker: %w (see %s)", err, filepath.Join(o.Dir, "checker.log"))
		}
	}
	r, err := ReadResult(o.Dir)
	if err != nil {
		return r, err
	}
	if len(r.Violations) > 0 {
		return r, fmt.Errorf("chaos: %d invariant violations (seed %d): %s", len(r.Violations)+r.Dropped, o.Seed, filepath.Join(o.Dir, ReportFile))
	}
	return r, faultErr
}

// ExitViolations is the checker's exit status when an invariant was
// broken.
const ExitViolations = 3

// ReadResult reads the checker's result of dir.
func ReadResult(dir string) (Result, error) {
	var r Result
	b, err := os.ReadFile(filepath.Join(dir, "result.json"))
	if err != nil {
		return r, fmt.Errorf("chaos: result: %w", err)
	}
	return r, json.Unmarshal(b, &r)
}

func startChecker(o Options) (*exec.Cmd, error) {
	logFile, err := os.Create(filepath.Join(o.Dir, "checker.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(o.Checker[0], o.Checker[1:]...) //nolint:gosec // the soak's own program
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	logFile.Close() // the checker has its own
	if err != nil {
		return nil, fmt.Errorf("chaos: start the checker: %w", err)
	}
	return cmd, nil
}

// waitWorkload waits until n pods of the workload are Ready.
func waitWorkload(ctx context.Context, bed *podbed.Bed, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	return poll.Until(ctx, func(ctx context.Context) error {
		if err := bed.Fleet.Exited(); err != nil {
			return poll.Permanent(err)
		}
		pods, err := bed.Cluster.Client().CoreV1().Pods(Workload).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, p := range pods.Items {
			if podbed.PodReady(&p) && p.DeletionTimestamp == nil {
				ready++
			}
		}
		if ready < n {
			return fmt.Errorf("%d of %d workload pods Ready", ready, n)
		}
		return nil
	})
}

// workload is the soak's: in each unit, a web DeploymentGrid of one pod
// per node behind its ServiceGrid (web-svc), a db StatefulSetGrid of one
// pod with its headless ServiceGrid, and a client that calls web-svc by
// name every half second and logs each answer. Every pod tolerates an
// unreachable or not-ready node for 30 s.
func workload(image string, nodes int) string {
	tolerations := fmt.Sprintf(`
        tolerations:
          - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: %[1]d}
          - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: %[1]d}`, int(toleration.Seconds()))
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: apps.atoll.io/v1alpha1
kind: DeploymentGrid
metadata: {name: web, namespace: %[1]s}
spec:
  gridUniqKey: atoll.io/unit
  template:
    replicas: %[2]d
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec:%[4]s
        affinity:
          podAntiAffinity:
            preferredDuringSchedulingIgnoredDuringExecution:
              - weight: 100
                podAffinityTerm:
                  topologyKey: kubernetes.io/hostname
                  labelSelector: {matchLabels: {app: web}}
        containers:
          - name: web
            image: %[3]s
            ports: [{containerPort: 8080}]
            readinessProbe: {periodSeconds: 1, httpGet: {path: /, port: 8080}}
---
apiVersion: apps.atoll.io/v1alpha1
kind: ServiceGrid
metadata: {name: web, namespace: %[1]s}
spec:
  gridUniqKey: atoll.io/unit
  template:
    selector: {app: web}
    ports: [{port: 80, targetPort: 8080}]
---
apiVersion: apps.atoll.io/v1alpha1
kind: StatefulSetGrid
metadata: {name: db, namespace: %[1]s}
spec:
  gridUniqKey: atoll.io/unit
  template:
    serviceName: db-svc
    replicas: 1
    selector: {matchLabels: {app: db}}
    template:
      metadata: {labels: {app: db}}
      spec:%[4]s
        containers:
          - name: db
            image: %[3]s
            ports: [{containerPort: 8080}]
            readinessProbe: {periodSeconds: 1, httpGet: {path: /, port: 8080}}
---
apiVersion: apps.atoll.io/v1alpha1
kind: ServiceGrid
metadata: {name: db, namespace: %[1]s}
spec:
  gridUniqKey: atoll.io/unit
  template:
    clusterIP: None
    selector: {app: db}
    ports: [{port: 8080}]
---
apiVersion: apps.atoll.io/v1alpha1
kind: DeploymentGrid
metadata: {name: client, namespace: %[1]s}
spec:
  gridUniqKey: atoll.io/unit
  template:
    replicas: 1
    selector: {matchLabels: {app: client}}
    template:
      metadata: {labels: {app: client}}
      spec:%[4]s
        containers:
          - name: client
            image: %[3]s
            command: [/hello, poll, "http://web-svc.%[1]s.svc.cluster.local/"]
`, Workload, nodes, image, tolerations)
}
