package health

import (
	"errors"
	"fmt"
	"time"

	"github.com/atoll-edge/atoll/cloud/units"
)

// Config tunes the health service.
type Config struct {
	// Units says which unit each Node is in.
	Units units.Rule
	// HoldTime: pods of a unit in FullDisruption (the whole site silent)
	// are kept this long, then Kubernetes proceeds (0: never held).
	HoldTime time.Duration
	// RejoinGrace: a held unit the cloud hears again (a ballot, a member
	// Ready) stays held while one of its members is still lost with no
	// verdict of its peers, for at most this long: the unit's agents and
	// kubelets reconnect one by one, and without it the first one back
	// ended the hold while the peers' ballots about the others were on
	// their way (0: the hold ends with the first sign).
	RejoinGrace time.Duration
	// CutGrace: the votes of a voter whose leaf link the hub reported
	// closed stop counting at once for verdicts and unit states, but keep
	// protecting for this long. A site cut off has its links reported
	// closed one at a time (each when its pings go unanswered, up to a
	// ping interval apart, or at the heal); without it the first closes
	// took its nodes below quorum before the last made the unit held
	// (0: votes stop protecting at once).
	CutGrace time.Duration
	// UnheardAfter: a unit whose every member the cloud lost is held
	// (FullDisruption) once no ballot of its voters has reached the hub
	// for this long, though the last ones' votes still count. Voters send
	// one at least every keep-alive (30 s) and their votes count 2.5
	// keep-alives (75 s), so the last ballots of a site that went dark
	// run out up to a keep-alive apart; waiting for the last one took the
	// first nodes' verdicts, and their protection, away before the unit
	// was held (the hub reports a dark site's links closed before that,
	// unless they closed while no replica ran). A member whose agent sent
	// nothing for this long counts as one whose link closed (Member.Unheard):
	// a site cut off while no replica ran, whose links' closes nobody
	// saw, is held once its Leases go stale, not only once the node
	// lifecycle controller has lost its last node. Longer than the voters'
	// keep-alive, shorter than their TTL less a keep-alive and a Resync
	// (0: only once the last vote ran out; no member is ever unheard).
	UnheardAfter time.Duration
	// ReturnGrace: a node protected until its kubelet reported again
	// keeps its serving pods' endpoints ready this long after: the node
	// lifecycle controller marked its pods not ready while it was lost,
	// and they stay so until the kubelet posts their status, moments
	// after the node's own (within a status sync, 10 s). A pod whose
	// containers the kubelet reports not ready is never kept (0: the
	// endpoints follow the pods at once).
	ReturnGrace time.Duration
	// SilentAfter: an agent whose leaf link the hub reported closed
	// counts as silent once it has sent no ballot for this long: longer
	// than a kubelet's Lease takes to go stale (half its 40 s), so that a
	// site cut off is seen by its Leases before its agents alone make the
	// unit AgentsSilent, and a unit forming (its agents' links bounce
	// before their first ballots) is never silent.
	SilentAfter time.Duration
	// VoteTTL is how long the votes of a ballot count when the voter gave
	// no TTL.
	VoteTTL time.Duration
	// MaxVoteTTL rejects a ballot that asks its votes to count longer
	// (voters ask 2.5 keep-alives, 75 s by default).
	MaxVoteTTL time.Duration
	// MaxVoteSkew rejects a ballot whose own time is further than this
	// from the time the hub stored it (a voter's clock that is off, or a
	// ballot forged to count in the future).
	MaxVoteSkew time.Duration
	// RepairAfter: a replica that does not lead restores a node it
	// protects that has been lost this long and is still not protected
	// (the leader died; its Lease passes on only after its duration). 0:
	// never.
	RepairAfter time.Duration
	// Resync re-checks every lost node and disrupted unit this often, so
	// expiring votes and holds take effect without a new event. The
	// informational writes wait this long, so those of one transition
	// coalesce (Service's write priorities).
	Resync time.Duration
	// Workers reconcile nodes concurrently.
	Workers int
	// ProtectedNamespace is where the protected set's ConfigMaps are kept
	// (atoll-cloud's own namespace); empty: no protected set.
	ProtectedNamespace string
	// Replicas of the hold bucket (match the hub's stream replicas).
	Replicas int
	// Protect limits the protection writes (a Node's unreachable taint,
	// its pods' endpoint readiness, a held unit's hold annotation) and
	// Info the informational ones (the verdict annotations), each with a
	// client and rate limiter of its own: protection never waits for
	// tokens an annotation took. Informational writes go through their own
	// workqueue, with InfoWorkers workers, so a backlog of them never holds
	// a reconcile (and the protection writes it makes) either.
	Protect, Info Limits
	InfoWorkers   int
}

// Limits are a Kubernetes client's rate limit: QPS sustained, Burst at once.
type Limits struct {
	QPS   float32
	Burst int
}

func (l Limits) validate(name string) error {
	if l.QPS <= 0 || l.Burst < 1 {
		return fmt.Errorf("health: %s QPS and burst must be positive", name)
	}
	return nil
}

// DefaultConfig holds a silent unit for 10 minutes.
func DefaultConfig() Config {
	return Config{Units: units.DefaultRule(), HoldTime: 10 * time.Minute, RejoinGrace: 30 * time.Second, CutGrace: 5 * time.Second, UnheardAfter: 35 * time.Second, ReturnGrace: 20 * time.Second, SilentAfter: 30 * time.Second, RepairAfter: 3 * time.Second, VoteTTL: 30 * time.Second, MaxVoteTTL: 3 * time.Minute, MaxVoteSkew: 30 * time.Second, Resync: 2 * time.Second, Workers: 4, Replicas: 1,
		Protect: Limits{QPS: 200, Burst: 400}, Info: Limits{QPS: 20, Burst: 40}, InfoWorkers: 2}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	if err := c.Units.Validate(); err != nil {
		return fmt.Errorf("health: %w", err)
	}
	switch {
	case c.HoldTime < 0:
		return errors.New("health: hold time must not be negative")
	case c.CutGrace < 0:
		return errors.New("health: cut grace must not be negative")
	case c.UnheardAfter < 0:
		return errors.New("health: unheard after must not be negative")
	case c.ReturnGrace < 0:
		return errors.New("health: return grace must not be negative")
	case c.RejoinGrace < 0:
		return errors.New("health: rejoin grace must not be negative")
	case c.SilentAfter < 0:
		return errors.New("health: silent after must not be negative")
	case c.RepairAfter < 0:
		return errors.New("health: repair after must not be negative")
	case c.VoteTTL <= 0:
		return errors.New("health: vote TTL must be positive")
	case c.MaxVoteTTL < c.VoteTTL:
		return errors.New("health: max vote TTL must be at least the vote TTL")
	case c.MaxVoteSkew <= 0:
		return errors.New("health: max vote skew must be positive")
	case c.Resync <= 0:
		return errors.New("health: resync must be positive")
	case c.Workers < 1:
		return errors.New("health: workers must be at least 1")
	case c.Replicas < 1:
		return errors.New("health: replicas must be at least 1")
	case c.InfoWorkers < 1:
		return errors.New("health: info workers must be at least 1")
	}
	if err := c.Protect.validate("protect"); err != nil {
		return err
	}
	return c.Info.validate("info")
}
