// Package sitesim runs simulated edge sites for the local demo and the
// end-to-end tests. Every simulated node gets its own loopback address
// (127.<net>.<site>.<n>), a kubelet-like /healthz endpoint on it, a Node in
// Kubernetes (through edgesim, when a simulator is given) and a real
// atoll-edge agent running in-process with its own embedded NATS server.
//
// It is test and demo tooling, not product code.
package sitesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/nats-io/nkeys"
	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/edgeapp"
	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/test/edgesim"
)

// Ports every simulated node listens on, at its own address.
const (
	RoutePort   = 6222
	KubeletPort = 10250
	AdminPort   = 9470
)

// Hub is where agents connect: the embedded hub (*hub.Hub) or a hub
// cluster (natstest.HubCluster).
type Hub interface {
	// IssueEdge issues node's credentials in unit for its nkey public
	// key pub: the user JWT the hub servers accept.
	IssueEdge(node, unit, pub string) (string, error)
	// LeafURLs are the servers' leaf URLs; every agent gets them all.
	LeafURLs() []string
	// Domain is the hub's JetStream domain.
	Domain() string
}

// Config configures a Sim.
type Config struct {
	// Hub is where agents connect; nodes are enrolled with it.
	Hub Hub
	// Kube registers every node in Kubernetes when set.
	Kube *edgesim.Simulator
	// UnitLabel is the label key that names the unit.
	UnitLabel string
	// StateDir is the parent of the agents' state directories.
	StateDir string
	// Net is the second octet of the nodes' loopback addresses
	// (127.<Net>.<site>.<n>); give concurrent simulations different nets.
	// Zero means 1.
	Net int
	// Agent adjusts each agent's configuration before it starts.
	Agent  func(*edgeapp.Config)
	Logger *slog.Logger
}

// Node is one simulated edge node.
type Node struct {
	Name, Unit, IP string

	seed    string
	userJWT string
	app     *fx.App
	nats    *natsnode.Node
	members *membership.Membership
	kubelet *http.Server
}

// NATS is the agent's embedded server (nil while the agent is stopped).
func (n *Node) NATS() *natsnode.Node { return n.nats }

// Membership is the agent's unit membership (nil while stopped).
func (n *Node) Membership() *membership.Membership { return n.members }

// Running reports whether the agent runs.
func (n *Node) Running() bool { return n.app != nil }

// Sim runs simulated sites.
type Sim struct {
	cfg   Config
	mu    sync.Mutex
	nodes map[string]*Node
	sites []string
}

// New returns an empty simulation.
func New(cfg Config) (*Sim, error) {
	if cfg.Hub == nil {
		return nil, errors.New("sitesim: no hub")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("sitesim: no state dir")
	}
	if cfg.UnitLabel == "" {
		cfg.UnitLabel = wellknown.LabelUnit
	}
	if cfg.Net == 0 {
		cfg.Net = 1
	}
	if cfg.Net < 1 || cfg.Net > 254 {
		return nil, fmt.Errorf("sitesim: net %d is outside 1..254", cfg.Net)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sim{cfg: cfg, nodes: map[string]*Node{}}, nil
}

// ZoneLabel is set to the unit on every simulated node: a unit is one
// failure zone for the node lifecycle controller too.
const ZoneLabel = "topology.kubernetes.io/zone"

// AddSite creates unit with n nodes named <unit>-<i>, registers them in
// Kubernetes and starts their kubelet endpoints and agents.
func (s *Sim) AddSite(ctx context.Context, unit string, n int) ([]*Node, error) {
	return s.addSite(ctx, unit, n, true)
}

// AddSiteWithoutAgents is AddSite with the agents left stopped: the site
// as plain Kubernetes sees it, without Atoll.
func (s *Sim) AddSiteWithoutAgents(ctx context.Context, unit string, n int) ([]*Node, error) {
	return s.addSite(ctx, unit, n, false)
}

func (s *Sim) addSite(ctx context.Context, unit string, n int, agents bool) ([]*Node, error) {
	s.mu.Lock()
	site := len(s.sites) + 1
	s.sites = append(s.sites, unit)
	s.mu.Unlock()
	if site > 250 || n > 250 {
		return nil, errors.New("sitesim: at most 250 sites of 250 nodes")
	}
	nodes := make([]*Node, 0, n)
	var specs []edgesim.NodeSpec
	for i := 1; i <= n; i++ {
		node := &Node{Name: fmt.Sprintf("%s-%d", unit, i), Unit: unit, IP: fmt.Sprintf("127.%d.%d.%d", s.cfg.Net, site, i)}
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, _ := kp.Seed()
		pub, _ := kp.PublicKey()
		node.seed = string(seed)
		if node.userJWT, err = s.cfg.Hub.IssueEdge(node.Name, unit, pub); err != nil {
			return nil, err
		}
		s.mu.Lock()
		s.nodes[node.Name] = node
		s.mu.Unlock()
		nodes = append(nodes, node)
		specs = append(specs, edgesim.NodeSpec{Name: node.Name, InternalIP: node.IP, Labels: map[string]string{s.cfg.UnitLabel: unit, ZoneLabel: unit}})
	}
	if s.cfg.Kube != nil {
		if err := s.cfg.Kube.AddNodes(ctx, specs...); err != nil {
			return nil, fmt.Errorf("sitesim: register nodes of %s: %w", unit, err)
		}
	}
	for _, node := range nodes {
		if err := s.StartKubelet(node.Name); err != nil {
			return nil, err
		}
		if !agents {
			continue
		}
		if err := s.StartAgent(ctx, node.Name); err != nil {
			return nil, err
		}
	}
	return nodes, nil
}

// Node returns the named node.
func (s *Sim) Node(name string) (*Node, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[name]
	if !ok {
		return nil, fmt.Errorf("sitesim: no node %q", name)
	}
	return n, nil
}

// Nodes returns every node, sorted by name.
func (s *Sim) Nodes() []*Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Node, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *Node) int {
		if a.Name < b.Name {
			return -1
		}
		return 1
	})
	return out
}

// StartAgent starts the node's atoll-edge agent.
func (s *Sim) StartAgent(ctx context.Context, name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	if n.app != nil {
		return nil
	}
	cfg := edgeapp.Default()
	cfg.Admin.Addr = net.JoinHostPort(n.IP, fmt.Sprint(AdminPort))
	cfg.NATS.NodeName = n.Name
	cfg.NATS.Seed, cfg.NATS.UserJWT = n.seed, n.userJWT
	cfg.NATS.HubURLs = s.cfg.Hub.LeafURLs()
	cfg.NATS.HubDomain = s.cfg.Hub.Domain()
	cfg.NATS.ClientPort = -1
	cfg.NATS.RouteHost = n.IP
	cfg.NATS.RoutePort = RoutePort
	cfg.Reporter.InternalIP = n.IP
	cfg.Reporter.Unit = n.Unit
	cfg.Reporter.Labels = map[string]string{s.cfg.UnitLabel: n.Unit}
	cfg.Reporter.Period = 2 * time.Second
	cfg.Membership.StateDir = filepath.Join(s.cfg.StateDir, n.Name)
	if s.cfg.Agent != nil {
		s.cfg.Agent(&cfg)
	}
	cfg.Finish()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("sitesim: agent %s: %w", n.Name, err)
	}
	var (
		nn  *natsnode.Node
		mem *membership.Membership
	)
	app := fx.New(edgeapp.Options(cfg, s.cfg.Logger), fx.Populate(&nn, &mem))
	if err := app.Err(); err != nil {
		return fmt.Errorf("sitesim: agent %s: %w", n.Name, err)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := app.Start(sctx); err != nil {
		return fmt.Errorf("sitesim: start agent %s: %w", n.Name, err)
	}
	s.mu.Lock()
	n.app, n.nats, n.members = app, nn, mem
	s.mu.Unlock()
	return nil
}

// StopAgent stops the node's agent (its NATS server goes with it).
func (s *Sim) StopAgent(ctx context.Context, name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	app := n.app
	n.app, n.nats, n.members = nil, nil, nil
	s.mu.Unlock()
	if app == nil {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return app.Stop(sctx)
}

// StartKubelet serves the node's kubelet /healthz on IP:10250.
func (s *Sim) StartKubelet(name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	if n.kubelet != nil {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(n.IP, fmt.Sprint(KubeletPort)))
	if err != nil {
		return fmt.Errorf("sitesim: kubelet of %s: %w", n.Name, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 2 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	s.mu.Lock()
	n.kubelet = srv
	s.mu.Unlock()
	return nil
}

// StopKubelet stops the node's kubelet endpoint.
func (s *Sim) StopKubelet(name string) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	srv := n.kubelet
	n.kubelet = nil
	s.mu.Unlock()
	if srv == nil {
		return nil
	}
	return srv.Close()
}

// SetLeaf cuts (false) or restores (true) the node's link to the hub.
func (s *Sim) SetLeaf(name string, up bool) error {
	n, err := s.Node(name)
	if err != nil {
		return err
	}
	if n.nats == nil {
		return fmt.Errorf("sitesim: agent of %s is stopped", name)
	}
	return n.nats.SetLeafEnabled(up)
}

// Close stops every agent and kubelet endpoint.
func (s *Sim) Close(ctx context.Context) error {
	var errs []error
	for _, n := range s.Nodes() {
		errs = append(errs, s.StopAgent(ctx, n.Name), s.StopKubelet(n.Name))
	}
	return errors.Join(errs...)
}
