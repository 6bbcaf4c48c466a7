package viewfeed

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/internal/hublink"
)

// Feeds makes the feeds of one agent: the same configuration, link,
// node and metrics for each.
type Feeds struct {
	cfg  Config
	link Link
	node Node
	log  *slog.Logger
	m    *Metrics
}

// NewFeeds returns the maker of feeds over link, for node. m may be nil
// (metrics not exported).
func NewFeeds(cfg Config, link Link, node Node, log *slog.Logger, m *Metrics) (*Feeds, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Feeds{cfg: cfg, link: link, node: &sharedLeaf{n: node, poll: cfg.LeafPoll}, log: log, m: m}, nil
}

// sharedLeaf asks the node for its leaf link at most once per LeafPoll
// for all the feeds of an agent (five): a node answers from its server's
// leaf list, which it builds for every ask.
type sharedLeaf struct {
	n    Node
	poll time.Duration
	mu   sync.Mutex
	at   time.Time
	l    natsnode.HubLink
}

func (s *sharedLeaf) HubLink() natsnode.HubLink {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.at) >= s.poll/2 {
		s.at, s.l = now, s.n.HubLink()
	}
	return s.l
}

// New returns a feed of o.Filter (see New).
func (fs *Feeds) New(o Options) (*Feed, error) {
	return New(fs.cfg, fs.link, fs.node, o, fs.log, fs.m)
}

type params struct {
	fx.In
	Config   Config
	Link     *hublink.Link
	Node     *natsnode.Node
	Log      *slog.Logger
	Registry prometheus.Registerer
}

// Module provides the agent's Feeds; the components that follow views
// (membership, hosts, proxy) make and run their own.
var Module = fx.Module("viewfeed",
	fx.Provide(func(p params) (*Feeds, error) {
		return NewFeeds(p.Config, p.Link, p.Node, p.Log, NewMetrics(p.Registry))
	}),
)
