package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/atoll-edge/atoll/internal/wellknown"
	"github.com/atoll-edge/atoll/test/kubenode"
	"github.com/atoll-edge/atoll/test/podbed"
)

// Injector makes a schedule's faults on an installation and journals
// each one as it takes effect and as it is undone.
type Injector struct {
	bed     *podbed.Bed
	journal *Journal
	log     *slog.Logger
	// cloud are the addresses a cut drops: the host (kube-apiserver, the
	// registry) and every cloud node and its pods.
	cloud []string
}

// NewInjector injects faults into bed, journaling them to j.
func NewInjector(bed *podbed.Bed, j *Journal, log *slog.Logger) *Injector {
	in := &Injector{bed: bed, journal: j, log: log, cloud: []string{bed.Cloud.HostIP()}}
	for _, c := range bed.Clouds {
		in.cloud = append(in.cloud, c.IP, c.PodCIDR)
	}
	return in
}

// Run plays s from now: each fault at its time, undone after its
// duration. It returns once every fault is undone, or at once when ctx
// ends (the faults in force are undone first).
func (in *Injector) Run(ctx context.Context, s Schedule) error {
	start := time.Now()
	if err := in.journal.Add(Entry{T: start, Phase: PhaseStart}); err != nil {
		return err
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for _, f := range s.Faults {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(f.At))):
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			if err := in.play(ctx, f); err != nil {
				in.log.Error("chaos: fault failed", "fault", f.String(), "err", err)
				_ = in.journal.Add(Entry{Phase: PhaseFailed, Fault: f, Detail: err.Error()})
				mu.Lock()
				errs = append(errs, fmt.Errorf("fault #%d %s: %w", f.ID, f.Kind, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(s.Duration))):
		}
	}
	_ = in.journal.Add(Entry{Phase: PhaseDone})
	return errors.Join(errs...)
}

// play makes f, waits its duration (or for ctx) and undoes it.
func (in *Injector) play(ctx context.Context, f Fault) error {
	in.log.Info("chaos: fault", "fault", f.String())
	// The fault is in force from its first step: a unit-reboot's cut
	// comes 15 s before its power cut, a restart's kill before the
	// component serves again.
	began := time.Now()
	undo, err := in.begin(ctx, f)
	if err != nil {
		if undo != nil {
			_ = undo(context.WithoutCancel(ctx))
		}
		return err
	}
	if err := in.journal.Add(Entry{T: began, Phase: PhaseBegin, Fault: f}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(f.For):
	}
	// Undo even when the run is cut short: the installation is left whole.
	if undo != nil {
		if err := undo(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("undo: %w", err)
		}
	}
	return in.journal.Add(Entry{Phase: PhaseEnd, Fault: f})
}

// begin makes f and returns how to undo it (nil: nothing to undo).
func (in *Injector) begin(ctx context.Context, f Fault) (func(context.Context) error, error) {
	bed := in.bed
	node := bed.Edges[f.Node]
	switch f.Kind {
	case NodeCut:
		return in.cut(node)
	case UnitCut:
		return in.cut(in.unit(f.Unit)...)
	case NodeFlap:
		return in.flap(ctx, f, node)
	case UnitReboot:
		nodes := in.unit(f.Unit)
		heal, err := in.cut(nodes...)
		if err != nil {
			return heal, err
		}
		// The unit is cut off first, as a site is when its uplink goes:
		// then every machine of it loses power and comes back.
		select {
		case <-ctx.Done():
			return heal, ctx.Err()
		case <-time.After(15 * time.Second):
		}
		for _, n := range nodes {
			n.PowerCut()
		}
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.Boot(ctx))
		}
		return heal, errors.Join(errs...)
	case Degrade:
		if err := node.Degrade(f.Loss, f.Rate); err != nil {
			return nil, err
		}
		return func(context.Context) error { node.Restore(); return nil }, nil
	case NodeDies:
		node.PowerCut()
		return node.Boot, nil
	case AgentKill:
		return nil, kill(node, "atoll-edge")
	case DiskFull:
		if _, err := node.FillDisk(); err != nil {
			return func(context.Context) error { return node.FreeDisk() }, err
		}
		return func(context.Context) error { return node.FreeDisk() }, nil
	case Relabel:
		if err := in.label(ctx, f.Node, f.To); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return in.label(ctx, f.Node, f.Unit) }, nil
	case CloudKill:
		n, err := in.leaderNode(ctx)
		if err != nil {
			return nil, err
		}
		return nil, kill(n, "atoll-cloud")
	case HubKill:
		var all []*kubenode.Node
		for _, c := range bed.Clouds {
			if len(c.Processes("nats-server")) > 0 {
				all = append(all, c)
			}
		}
		if len(all) == 0 {
			return nil, errors.New("no hub server runs")
		}
		return nil, killOne(all[f.ID%len(all)], "nats-server", f.ID)
	case KCMRestart:
		return nil, bed.Cluster.Restart(ctx, "kube-controller-manager")
	case APIServerRestart:
		return nil, bed.Cluster.Restart(ctx, "kube-apiserver")
	}
	return nil, fmt.Errorf("unknown fault kind %q", f.Kind)
}

func (in *Injector) unit(name string) []*kubenode.Node {
	var out []*kubenode.Node
	for _, n := range in.bed.Units()[name] {
		out = append(out, in.bed.Edges[n])
	}
	return out
}

// cut drops every packet between nodes and the cloud.
func (in *Injector) cut(nodes ...*kubenode.Node) (func(context.Context) error, error) {
	heal := func(context.Context) error {
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.Heal())
		}
		return errors.Join(errs...)
	}
	for _, n := range nodes {
		if err := n.Cut(in.cloud...); err != nil {
			return heal, err
		}
	}
	return heal, nil
}

// flap cuts node f.Flaps times: in each of f.For's equal slots, cut for
// its first half.
func (in *Injector) flap(ctx context.Context, f Fault, node *kubenode.Node) (func(context.Context) error, error) {
	slot := f.For / time.Duration(f.Flaps)
	done := make(chan error, 1)
	flapCtx, cancel := context.WithCancel(ctx)
	go func() {
		var err error
		defer func() { done <- err }()
		for range f.Flaps {
			if err = node.Cut(in.cloud...); err != nil {
				return
			}
			select {
			case <-flapCtx.Done():
			case <-time.After(slot / 2):
			}
			if err = node.Heal(); err != nil || flapCtx.Err() != nil {
				return
			}
			select {
			case <-flapCtx.Done():
				return
			case <-time.After(slot - slot/2):
			}
		}
	}()
	return func(context.Context) error {
		cancel()
		return errors.Join(<-done, node.Heal())
	}, nil
}

// label moves node to unit: its unit and its zone, as the operator guide
// labels them.
func (in *Injector) label(ctx context.Context, node, unit string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,%q:%q}}}`, wellknown.LabelUnit, unit, corev1.LabelTopologyZone, unit)
	_, err := in.bed.Cluster.Client().CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// leaderNode is the cloud node whose atoll-cloud holds the leader Lease
// (the first cloud node when none does).
func (in *Injector) leaderNode(ctx context.Context) (*kubenode.Node, error) {
	bed := in.bed
	lease, err := bed.Cluster.Client().CoordinationV1().Leases(podbed.Namespace).Get(ctx, "atoll-cloud", metav1.GetOptions{})
	if err != nil || lease.Spec.HolderIdentity == nil {
		return bed.Cloud, nil //nolint:nilerr // no leader: any replica
	}
	pod, err := bed.Cluster.Client().CoreV1().Pods(podbed.Namespace).Get(ctx, *lease.Spec.HolderIdentity, metav1.GetOptions{})
	if err != nil {
		return bed.Cloud, nil //nolint:nilerr // a holder that is no pod: any replica
	}
	if i := slices.IndexFunc(bed.Clouds, func(n *kubenode.Node) bool { return n.Name == pod.Spec.NodeName }); i >= 0 {
		return bed.Clouds[i], nil
	}
	return bed.Cloud, nil
}

// kill kills every process comm of node with SIGKILL.
func kill(node *kubenode.Node, comm string) error {
	pids := node.Processes(comm)
	if len(pids) == 0 {
		return fmt.Errorf("no %s runs on %s", comm, node.Name)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// killOne kills the process comm of node picked by n with SIGKILL.
func killOne(node *kubenode.Node, comm string, n int) error {
	pids := node.Processes(comm)
	if len(pids) == 0 {
		return fmt.Errorf("no %s runs on %s", comm, node.Name)
	}
	slices.Sort(pids)
	return syscall.Kill(pids[n%len(pids)], syscall.SIGKILL)
}
