package manager

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Leadership, by terms. A replica campaigns for the Lease; a term starts
// when it acquires it and ends when it loses it (a renewal missed its
// deadline: the apiserver slow or unreachable) or stops. Losing a term
// never stops the process: the replica keeps its cache, keeps serving
// (webhook, status, views) and campaigns again at once. controller-runtime
// ends the whole manager when its leader election is lost, so the manager
// runs without it and this elector decides who writes:
//
//   - OnTerm runs a function for each term, with a context that ends with
//     the term (consumers only the leader runs);
//   - LeaderOnly wraps a controller's reconciler: a request that reaches a
//     replica that does not lead is dropped, and TermSource enqueues, when
//     a term starts, every object the controller reconciles, as a new
//     leader's controller does when it starts.
type elector struct {
	mu      sync.Mutex
	lead    bool
	term    context.CancelFunc
	termCtx context.Context
	starts  []func(ctx context.Context)
	// elected is closed while this replica leads and replaced when a term
	// ends.
	elected chan struct{}
	terms   int
}

func newElector() *elector { return &elector{elected: make(chan struct{})} }

// Leading reports whether this replica leads now: false from the moment
// its term's context ends (client-go ends it before it calls back that
// leading stopped). Without leader election every replica leads.
func (m *Manager) Leading() bool {
	m.el.mu.Lock()
	defer m.el.mu.Unlock()
	return m.el.lead && m.el.termCtx.Err() == nil
}

// Elected is closed while this replica leads; a new channel replaces it
// when the term ends (call again for the next term).
func (m *Manager) Elected() <-chan struct{} {
	m.el.mu.Lock()
	defer m.el.mu.Unlock()
	return m.el.elected
}

// Terms counts the terms this replica has led.
func (m *Manager) Terms() int {
	m.el.mu.Lock()
	defer m.el.mu.Unlock()
	return m.el.terms
}

// OnTerm runs fn in a goroutine of its own for each term this replica
// leads, with a context that ends with the term. Call it before Start.
func (m *Manager) OnTerm(fn func(ctx context.Context)) {
	m.el.mu.Lock()
	defer m.el.mu.Unlock()
	m.el.starts = append(m.el.starts, fn)
}

// begin starts a term.
func (e *elector) begin(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	tctx, cancel := context.WithCancel(ctx)
	e.lead, e.term, e.termCtx = true, cancel, tctx
	e.terms++
	close(e.elected)
	for _, fn := range e.starts {
		go fn(tctx)
	}
}

// end ends the current term, if any.
func (e *elector) end() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.lead {
		return
	}
	e.term()
	e.lead, e.term, e.termCtx = false, nil, nil
	e.elected = make(chan struct{})
}

// campaign runs leader election until ctx ends: each time the Lease is
// lost, it campaigns again after the retry period. Without leader
// election, one term lasts as long as ctx.
func (m *Manager) campaign(ctx context.Context) error {
	if !m.cfg.LeaderElect {
		m.el.begin(ctx)
		<-ctx.Done()
		m.el.end()
		return nil
	}
	cs, err := kubernetes.NewForConfig(m.GetConfig())
	if err != nil {
		return fmt.Errorf("manager: leader election client: %w", err)
	}
	id := m.cfg.Identity
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("manager: leader election identity: %w", err)
		}
		id = host + "_" + string(uuid.NewUUID())
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, m.cfg.LeaderElectionNamespace, m.cfg.LeaderElectionID,
		cs.CoreV1(), cs.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id,
			// "<identity> became leader" events on the Lease, as Kubernetes'
			// own controllers record them.
			EventRecorder: m.GetEventRecorderFor(m.cfg.LeaderElectionID)})
	if err != nil {
		return fmt.Errorf("manager: leader election lock: %w", err)
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:          lock,
			LeaseDuration: m.cfg.LeaseDuration,
			RenewDeadline: m.cfg.RenewDeadline,
			RetryPeriod:   m.cfg.RetryPeriod,
			// client-go's release on cancel also runs after a failed
			// renewal, and the term would last until that release gave
			// up (another RenewDeadline): past the Lease's expiry,
			// when another replica may lead. The term ends at once
			// instead, and a replica that stops releases the Lease
			// itself (release).
			ReleaseOnCancel: false,
			Name:            m.cfg.LeaderElectionID,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(tctx context.Context) {
					m.log.Info("leading", "lease", m.cfg.LeaderElectionNamespace+"/"+m.cfg.LeaderElectionID, "identity", id)
					m.metrics.leading.Set(1)
					m.el.begin(tctx)
				},
				OnStoppedLeading: func() {
					m.metrics.leading.Set(0)
					m.el.end()
					if ctx.Err() == nil {
						m.log.Warn("lost the lease; following and campaigning again", "lease", m.cfg.LeaderElectionNamespace+"/"+m.cfg.LeaderElectionID)
						m.metrics.lost.Inc()
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("manager: leader election: %w", err)
		}
		le.Run(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(m.cfg.RetryPeriod):
		}
	}
	release(lock, id, m.cfg.RenewDeadline, m.log)
	return nil
}

// release gives up the Lease if this replica (id) still holds it, once
// it has stopped, so that another replica leads at its next retry
// instead of after the Lease's duration. The update carries the
// resource version read, so a Lease another replica took meanwhile is
// left alone. A conflict is read again: a renewal this replica sent as
// it stopped may land between the read and the update.
func release(lock resourcelock.Interface, id string, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	released := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rec, _, err := lock.Get(ctx)
		if err != nil || rec.HolderIdentity != id {
			return nil
		}
		now := metav1.NewTime(time.Now())
		if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{
			LeaderTransitions:    rec.LeaderTransitions,
			LeaseDurationSeconds: 1,
			RenewTime:            now,
			AcquireTime:          now,
		}); err != nil {
			return err
		}
		released = true
		return nil
	})
	if err != nil {
		log.Warn("could not release the leader Lease; another replica leads once it expires", "err", err)
		return
	}
	if released {
		log.Info("released the leader Lease")
	}
}

// LeaderSilent reports whether the leader Lease has gone unrenewed for
// two retry periods (a leader renews it every retry period), or has no
// holder: the leader is dead or cut off, and another replica will lead
// once the Lease expires. It reads the Lease from the apiserver. The
// renew time is the leader's clock: replicas' clocks are assumed within
// a second of each other.
func (m *Manager) LeaderSilent(ctx context.Context) (bool, error) {
	if !m.cfg.LeaderElect {
		return false, nil
	}
	var lease coordinationv1.Lease
	key := client.ObjectKey{Namespace: m.cfg.LeaderElectionNamespace, Name: m.cfg.LeaderElectionID}
	if err := m.GetAPIReader().Get(ctx, key, &lease); err != nil {
		return false, fmt.Errorf("manager: read the leader Lease: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" || lease.Spec.RenewTime == nil {
		return true, nil
	}
	return time.Since(lease.Spec.RenewTime.Time) > 2*m.cfg.RetryPeriod, nil
}

// LeaderOnly wraps r so that only the leading replica reconciles: a
// request that reaches a replica that does not lead is dropped (the
// leader's controller sees the same events, and a new leader reconciles
// everything: TermSource).
func (m *Manager) LeaderOnly(r reconcile.Reconciler) reconcile.Reconciler {
	return reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
		if !m.Leading() {
			return reconcile.Result{}, nil
		}
		return r.Reconcile(ctx, req)
	})
}

// TermSource is a source for a LeaderOnly controller: each time this
// replica starts leading, it enqueues every object of list's kind in the
// cache (the objects the controller reconciles), as a controller started
// by a new leader would.
func (m *Manager) TermSource(list client.ObjectList) source.Source {
	return m.TermSourceMap(list, func(o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
	})
}

// TermSourceMap is TermSource for a controller that reconciles other
// objects than those listed: each time this replica starts leading, it
// enqueues what requests returns for each object of list's kind in the
// cache (it must not keep them: they are the cache's own).
func (m *Manager) TermSourceMap(list client.ObjectList, requests func(client.Object) []reconcile.Request) source.Source {
	return source.Func(func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		m.OnTermAfterStart(func(tctx context.Context) {
			l := list.DeepCopyObject().(client.ObjectList)
			if err := m.GetCache().List(tctx, l, client.UnsafeDisableDeepCopy); err != nil {
				m.log.Warn("a new term could not list what to reconcile", "kind", fmt.Sprintf("%T", list), "err", err)
				return
			}
			_ = apimeta.EachListItem(l, func(o runtime.Object) error {
				if co, ok := o.(client.Object); ok {
					for _, r := range requests(co) {
						q.Add(r)
					}
				}
				return nil
			})
		})
		return nil
	})
}

// OnTermAfterStart is OnTerm for a function registered once the manager
// runs (a controller's source starts with it): if this replica leads
// already, fn runs for the current term at once.
func (m *Manager) OnTermAfterStart(fn func(ctx context.Context)) {
	m.el.mu.Lock()
	defer m.el.mu.Unlock()
	m.el.starts = append(m.el.starts, fn)
	if m.el.lead {
		go fn(m.el.termCtx)
	}
}
