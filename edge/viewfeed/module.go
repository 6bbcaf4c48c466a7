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
	api  chan struct{} // one catch-up's JetStream API requests of the agent's feeds at a time
}

// NewFeeds returns the maker of feeds over link, for node. m may be nil
// (metrics not exported).
func NewFeeds(cfg Config, link Link, node Node, log *slog.Logger, m *Metrics) (*Feeds, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Feeds{cfg: cfg, link: link, node: &sharedLeaf{n: node, poll: cfg.LeafPoll}, log: log, m: m, api: make(chan struct{}, 1)}, nil
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

// New returns a feed of o.Filter (see New). The agent's feeds send their
// catch-ups' JetStream API requests (a stream info, a consumer) one
// catch-up at a time, so that an agent has at most one of them in flight
// whatever its feeds want: after a hub restart every feed of the fleet
// wants them at once, and the hub's JetStream API drops its whole queue
// once 10,000 wait. The consumers' reads are not held. (A request the
// agent gave up on still waits in the hub's queue: see
// docs/benchmarks.md, reconnect storm.)
func (fs *Feeds) New(o Options) (*Feed, error) {
	f, err := New(fs.cfg, fs.link, fs.node, o, fs.log, fs.m)
	if err != nil {
		return nil, err
	}
	f.api = fs.api
	return f, nil
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
