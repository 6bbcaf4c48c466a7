package events

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream names on the hub.
const (
	StreamHealth   = "HEALTH"
	StreamTopology = "TOPOLOGY"
	StreamViews    = "VIEWS"
)

// StreamOptions tune the hub streams to the deployment.
type StreamOptions struct {
	// Replicas is 1 for a single hub server, 3 for a hub cluster.
	Replicas int
	// Storage is where the streams live; file unless testing.
	Storage jetstream.StorageType
	// MaxBytes caps each stream's storage (0: no cap); the oldest
	// messages go first.
	MaxBytes int64
}

// DefaultStreamOptions suit a single hub server.
func DefaultStreamOptions() StreamOptions {
	return StreamOptions{Replicas: 1, Storage: jetstream.FileStorage}
}

// Validate names the first bad field.
func (o StreamOptions) Validate() error {
	if o.Replicas < 1 || o.Replicas > 5 {
		return fmt.Errorf("stream replicas: %d is outside 1..5", o.Replicas)
	}
	if o.MaxBytes < 0 {
		return fmt.Errorf("stream max bytes: %d is negative", o.MaxBytes)
	}
	return nil
}

func (o StreamOptions) maxBytes() int64 {
	if o.MaxBytes == 0 {
		return -1
	}
	return o.MaxBytes
}

// StreamDef is a hub stream as the catalog declares it: its name and
// limits. Its subjects come from the families stored in it.
type StreamDef struct {
	Name        string
	Description string
	// MaxMsgsPerSubject keeps the last n messages of each subject.
	MaxMsgsPerSubject int64
	// MaxAge drops older messages (0: never).
	MaxAge time.Duration
	// AllowRollup lets a publisher replace a subject's history.
	AllowRollup bool
	// AllowDirect serves reads of a subject's last value from any replica
	// on a subject that names it ($JS.API.DIRECT.GET.<stream>.<subject>),
	// so a permission can grant an edge the reads of its own views only.
	AllowDirect bool
	// MaxConsumers bounds the stream's consumers (0: the server's
	// default, which nats-server ≥ 2.12 sets to 1,000 for a stream that
	// declares none, whatever the server or account allows).
	MaxConsumers int
	// RePublish has the server publish every message it stores again,
	// on another subject, with its stream sequence in headers.
	RePublish *jetstream.RePublish
}

// streamDefs are the hub streams.
//
//   - HEALTH keeps the last few ballots (and votes) per subject: health is
//     state, not history. Probe reports are not in it: they stay inside
//     their unit.
//   - TOPOLOGY keeps the last report of each node.
//   - VIEWS keeps the last value of each view (a KV in all but name), so an
//     edge agent resumes from where it left off; agents compare what they
//     hold with it by direct gets (a replica may answer slightly behind the
//     leader; the next check corrects that, and the cloud's
//     publishes expect the last sequence they read, so a stale read costs
//     a retry, never a lost view).
var streamDefs = []StreamDef{
	{Name: StreamHealth, Description: "Edge voters' ballots", MaxMsgsPerSubject: 4, MaxAge: time.Hour},
	{Name: StreamTopology, Description: "Edge agents' reports of themselves and the units' lifecycle events", MaxMsgsPerSubject: 1, MaxAge: 7 * 24 * time.Hour},
	// Edge agents follow their views on the republished subjects
	// (edge/viewfeed) and read VIEWS with short-lived consumers of their
	// own to catch up, a few per node at a time at most: far more than
	// the server's default bound.
	{Name: StreamViews, Description: "The cloud's views for edge agents: per unit, and shared by all units (_all)", MaxMsgsPerSubject: 1, AllowRollup: true, AllowDirect: true, MaxConsumers: ViewsMaxConsumers,
		RePublish: &jetstream.RePublish{Source: ViewSubjects, Destination: ViewRepublishSubjects}},
}

// ViewsMaxConsumers is VIEWS' bound on consumers: room for the catch-ups
// of 100,000 edge agents.
const ViewsMaxConsumers = 1_000_000

// StreamDefs returns the hub streams as the catalog declares them.
func StreamDefs() []StreamDef { return slices.Clone(streamDefs) }

// StreamSubjects are the subjects of stream: the wildcard of every family
// the catalog stores in it, leaving out wildcards that another one covers
// (the object view family covers the other views).
func StreamSubjects(stream string) []string {
	var all []string
	for _, f := range catalog {
		if f.Transport == TransportStream && f.Stream == stream && !slices.Contains(all, f.Wildcard()) {
			all = append(all, f.Wildcard())
		}
	}
	var out []string
	for _, w := range all {
		covered := false
		for _, o := range all {
			if o != w && SubjectMatches(o, w) {
				covered = true
			}
		}
		if !covered {
			out = append(out, w)
		}
	}
	return out
}

// SubjectMatches reports whether every subject that pattern p matches is
// also matched by filter (both may hold '*' and a trailing '>').
func SubjectMatches(filter, p string) bool {
	ft, pt := strings.Split(filter, "."), strings.Split(p, ".")
	for i, f := range ft {
		if f == ">" {
			return len(pt) > i
		}
		if i >= len(pt) {
			return false
		}
		switch {
		case f == "*":
			if pt[i] == ">" {
				return false
			}
		case f != pt[i]:
			return false
		}
	}
	return len(ft) == len(pt)
}

// Streams returns the configuration of every hub stream: the catalog's
// definitions and subjects with the deployment's options.
func Streams(o StreamOptions) []jetstream.StreamConfig {
	out := make([]jetstream.StreamConfig, 0, len(streamDefs))
	for _, d := range streamDefs {
		out = append(out, jetstream.StreamConfig{
			Name:              d.Name,
			Description:       d.Description,
			Subjects:          StreamSubjects(d.Name),
			Retention:         jetstream.LimitsPolicy,
			MaxMsgsPerSubject: d.MaxMsgsPerSubject,
			MaxAge:            d.MaxAge,
			Discard:           jetstream.DiscardOld,
			Duplicates:        2 * time.Minute,
			AllowRollup:       d.AllowRollup,
			AllowDirect:       d.AllowDirect,
			Storage:           o.Storage,
			Replicas:          o.Replicas,
			MaxBytes:          o.maxBytes(),
			MaxConsumers:      d.MaxConsumers,
			RePublish:         clonePtr(d.RePublish),
		})
	}
	return out
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}
