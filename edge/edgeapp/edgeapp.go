// Package edgeapp composes atoll-edge: the node's embedded NATS server and
// the edge components, as one fx application. It must never import
// Kubernetes client code: edge agents hold no Kubernetes credentials.
package edgeapp

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"go.uber.org/fx"

	"github.com/atoll-edge/atoll/edge/enroll"
	"github.com/atoll-edge/atoll/edge/hosts"
	"github.com/atoll-edge/atoll/edge/membership"
	"github.com/atoll-edge/atoll/edge/natsnode"
	"github.com/atoll-edge/atoll/edge/prober"
	"github.com/atoll-edge/atoll/edge/proxy"
	"github.com/atoll-edge/atoll/edge/reporter"
	edgetunnel "github.com/atoll-edge/atoll/edge/tunnel"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/edge/voter"
	"github.com/atoll-edge/atoll/internal/admin"
	"github.com/atoll-edge/atoll/internal/cliflags"
	"github.com/atoll-edge/atoll/internal/fxrun"
	"github.com/atoll-edge/atoll/internal/logging"
)

// Config is atoll-edge's whole configuration.
type Config struct {
	Log        logging.Config
	Admin      admin.Config
	NATS       natsnode.Config
	Reporter   reporter.Config
	Membership membership.Config
	// ViewFeed follows the node's views (membership's, the hosts
	// writer's) off the hub's republished copies.
	ViewFeed viewfeed.Config
	Prober   prober.Config
	Voter    voter.Config
	Enroll   enroll.Config
	// Proxy is the endpoints proxy kube-proxy reads (off without
	// --proxy-addr).
	Proxy proxy.Config
	// Hosts writes the unit's StatefulSetGrid hosts file (off without
	// --hosts-file).
	Hosts hosts.Config
	// Kubelet is the default probe target of the prober's plugins.
	Kubelet Kubelet
	// Tunnel is the tunnel agent (cloud-to-edge sessions).
	Tunnel edgetunnel.Config
}

// Kubelet describes how peers' kubelets are probed by the default
// plugins: a TCP connect to the port and a GET of /healthz.
type Kubelet struct {
	Port               int
	Scheme             string
	TokenFile          string
	CAFile             string
	InsecureSkipVerify bool
}

// Default is the production configuration; the node name defaults to
// $NODE_NAME (set it from the downward API's spec.nodeName).
func Default() Config {
	c := Config{
		Log:        logging.Default(),
		Admin:      admin.Config{Addr: "127.0.0.1:9470"},
		NATS:       natsnode.Default(),
		Reporter:   reporter.DefaultConfig(),
		Membership: membership.Config{StateDir: "/var/lib/atoll"},
		ViewFeed:   viewfeed.DefaultConfig(),
		Prober:     prober.DefaultConfig(),
		Voter:      voter.DefaultConfig(),
		Enroll:     enroll.DefaultConfig(),
		Proxy:      proxy.DefaultConfig(),
		Hosts:      hosts.DefaultConfig(),
		Kubelet:    Kubelet{Port: 10250, Scheme: "https", InsecureSkipVerify: true},
		Tunnel:     edgetunnel.DefaultConfig(),
	}
	c.NATS.NodeName = os.Getenv("NODE_NAME")
	return c
}

// RegisterFlags binds c's fields to flags of fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Log.Level, "log-level", c.Log.Level, "log level: debug, info, warn, error")
	fs.StringVar(&c.Log.Format, "log-format", c.Log.Format, "log format: json or text")
	c.Admin.RegisterFlags(fs)
	fs.StringVar(&c.NATS.NodeName, "node-name", c.NATS.NodeName, "Kubernetes node name (default $NODE_NAME)")
	fs.Var((*cliflags.List)(&c.NATS.HubURLs), "hub-url", "hub leafnode URL, nats-leaf://host:7422 (repeatable)")
	fs.StringVar(&c.NATS.HubDomain, "hub-domain", c.NATS.HubDomain, "JetStream domain of the hub")
	fs.StringVar(&c.NATS.HubServerName, "hub-tls-server-name", c.NATS.HubServerName, "name the hub's leaf certificate must carry (empty: the host dialed); atoll-cloud's generated one names atoll-hub.atoll-system.svc")
	fs.StringVar(&c.NATS.HubCAFile, "hub-ca-file", c.NATS.HubCAFile, "PEM CAs the hub's leaf certificate must chain to: the leaf link runs over TLS and an unverified hub is refused (empty: plain unless the hub asks for TLS)")
	fs.StringVar(&c.NATS.HubCompression, "hub-compression", c.NATS.HubCompression, "leaf link compression: off, s2_auto (by round trip time: none below 10 ms, stronger above), s2_uncompressed, s2_fast, s2_better or s2_best")
	fs.DurationVar(&c.NATS.HubPingInterval, "hub-ping-interval", natsnode.DefaultHubPingInterval, "how often the node's server pings over its leaf link to the hub; a link leaving --hub-max-pings-out unanswered is closed and dialed again, so a silently dead link is noticed within (max+1) × interval")
	fs.IntVar(&c.NATS.HubMaxPingsOut, "hub-max-pings-out", natsnode.DefaultHubMaxPingsOut, "unanswered pings before the leaf link is closed")
	fs.StringVar(&c.NATS.CredsFile, "creds-file", c.NATS.CredsFile, "the node's NATS credentials (its identity on the hub; written on enrollment and renewal)")
	fs.StringVar(&c.NATS.BootstrapFile, "bootstrap-token-file", c.NATS.BootstrapFile, "one-time bootstrap token (atoll node enroll), used while --creds-file does not exist")
	fs.StringVar(&c.NATS.EnrollCredsFile, "enroll-creds-file", c.NATS.EnrollCredsFile, "the installation's shared enrollment credentials (the Secret atoll-edge-enroll), used while neither --creds-file nor --bootstrap-token-file exists: the node then enrolls with --service-account-token-file")
	fs.StringVar(&c.Enroll.ServiceAccountTokenFile, "service-account-token-file", c.Enroll.ServiceAccountTokenFile, "the pod's projected ServiceAccount token (audience atoll), which proves to atoll-cloud which node the agent runs on (with --enroll-creds-file)")
	fs.DurationVar(&c.Enroll.Check, "creds-check", c.Enroll.Check, "how often the credentials' expiry is checked (they are renewed after 2/3 of their lifetime)")
	fs.StringVar(&c.NATS.ClientHost, "client-host", c.NATS.ClientHost, "loopback address for local NATS clients")
	fs.IntVar(&c.NATS.ClientPort, "client-port", c.NATS.ClientPort, "port for local NATS clients on loopback (-1: random); a port in use fails the start")
	fs.StringVar(&c.NATS.RouteHost, "route-host", c.NATS.RouteHost, "interface unit peers route to")
	fs.IntVar(&c.NATS.RoutePort, "route-port", c.NATS.RoutePort, "port unit peers route to (-1: random)")
	fs.StringVar(&c.NATS.RouteAdvertise, "route-advertise", c.NATS.RouteAdvertise, "host:port unit peers dial (default: internal IP and route port)")
	fs.StringVar(&c.Reporter.InternalIP, "internal-ip", c.Reporter.InternalIP, "the node's InternalIP (set it from the downward API's status.hostIP)")
	fs.StringVar(&c.Reporter.Unit, "unit", c.Reporter.Unit, "unit this node declares itself in (empty: none)")
	fs.Var((*cliflags.Map)(&c.Reporter.Labels), "labels", "node labels to report, k=v,k=v")
	fs.DurationVar(&c.Reporter.Period, "report-period", c.Reporter.Period, "period of topology reports")
	fs.StringVar(&c.Membership.StateDir, "state-dir", c.Membership.StateDir, "directory keeping the last known unit membership")
	fs.DurationVar(&c.ViewFeed.CheckPeriod, "view-check-period", c.ViewFeed.CheckPeriod, "how often the agent checks each view space it follows against the hub's stream, besides at start, after every leaf reconnect and on a detected gap: one direct get, and every 12th check a full catch-up (a few requests to the hub and a consumer that lives 15 s)")
	fs.Var(proxyAddr{c}, "proxy-addr", "listen address of the endpoints proxy that kube-proxy uses as its apiserver, e.g. 127.0.0.1:9471 (empty: no proxy)")
	fs.StringVar(&c.Hosts.Path, "hosts-file", c.Hosts.Path, "CoreDNS hosts-plugin file kept with the unit's StatefulSetGrid names (empty: none; see deploy/coredns-atoll-hosts.conf)")
	fs.StringVar(&c.Hosts.ClusterDomain, "cluster-domain", c.Hosts.ClusterDomain, "cluster DNS domain appended to the StatefulSetGrid names")
	fs.DurationVar(&c.Proxy.Bookmark, "proxy-bookmark", c.Proxy.Bookmark, "how often the endpoints proxy sends a watch bookmark")
	fs.BoolVar(&c.Proxy.RelayViews, "proxy-relay-views", c.Proxy.RelayViews, "share the hub's copies of the shared views (Services, EndpointSlices, Endpoints) with the unit: the hub sends each change to one agent of the unit, which relays it on the unit's routes, signed by the cloud (false: every agent takes its own copy from the hub)")
	fs.DurationVar(&c.Proxy.RelayFreshness, "proxy-relay-freshness", c.Proxy.RelayFreshness, "how far from this node's clock the cloud's time on a view relayed by a unit peer may be; a staler one is refused")
	fs.DurationVar(&c.Prober.Period, "probe-period", c.Prober.Period, "period of peer probe rounds")
	fs.DurationVar(&c.Prober.RoundBudget, "probe-round-budget", c.Prober.RoundBudget, "time a probe round may take, at most half of --vote-timeout")
	fs.IntVar(&c.Prober.Parallelism, "probe-parallelism", c.Prober.Parallelism, "most unit members checked at once")
	fs.Float64Var(&c.Prober.Scoreline, "probe-scoreline", c.Prober.Scoreline, "score a peer needs to be normal (100 × sum of passing plugin weights)")
	fs.IntVar(&c.Kubelet.Port, "kubelet-port", c.Kubelet.Port, "peers' kubelet port, probed by TCP and by GET /healthz")
	fs.StringVar(&c.Kubelet.Scheme, "kubelet-scheme", c.Kubelet.Scheme, "http or https for the kubelet /healthz probe")
	fs.StringVar(&c.Kubelet.TokenFile, "kubelet-token-file", c.Kubelet.TokenFile, "bearer token for the kubelet /healthz probe, read again when it changes (grant it get on nodes/healthz); without one a kubelet with anonymous auth off answers 401, which counts as up")
	fs.StringVar(&c.Kubelet.CAFile, "kubelet-ca-file", c.Kubelet.CAFile, "CA bundle verifying the kubelets' serving certificates")
	fs.BoolVar(&c.Kubelet.InsecureSkipVerify, "kubelet-insecure", c.Kubelet.InsecureSkipVerify, "skip kubelet certificate verification (self-signed kubelet certificates)")
	fs.DurationVar(&c.Voter.Timeout, "vote-timeout", c.Voter.Timeout, "a probe report no longer counts once older than this")
	fs.DurationVar(&c.Voter.Skew, "vote-skew", c.Voter.Skew, "clock skew tolerated between unit members")
	fs.DurationVar(&c.Voter.KeepAlive, "vote-keepalive", c.Voter.KeepAlive, "send the unit's ballot again this often when no verdict changed")
	fs.DurationVar(&c.Voter.TTL, "vote-ttl", c.Voter.TTL, "how long the cloud may count a ballot after storing it (at least the keep-alive plus the ack timeout)")
	// Tunnel agent.
	fs.BoolVar(&c.Tunnel.Enabled, "tunnel", c.Tunnel.Enabled, "serve the cloud's tunnel sessions (kubectl logs/exec/port-forward) to allow-listed local targets")
	fs.StringVar(&c.Tunnel.Kubelet, "tunnel-kubelet", c.Tunnel.Kubelet, "local address of the kubelet the tunnel reaches (always allowed; the cloud's requested port selects it)")
	fs.Var((*cliflags.List)(&c.Tunnel.Allow), "tunnel-allow", "comma-separated further local host:port targets the tunnel may reach, selected by port")
	fs.BoolVar(&c.Tunnel.Relay, "tunnel-relay", c.Tunnel.Relay, "relay the tunnel sessions of unit peers whose own leaf link is down (only to members of this node's unit)")
	fs.StringVar(&c.Tunnel.APIServerListen, "tunnel-apiserver-listen", c.Tunnel.APIServerListen, "loopback host:port whose connections reach kube-apiserver through the hub (the local API endpoint's --apiserver-via=hub); empty: none")
	fs.DurationVar(&c.Tunnel.Session.LinkTimeout, "tunnel-link-timeout", c.Tunnel.Session.LinkTimeout, "a tunnel session survives a loss of the link shorter than this (0: 10s)")
}

// Finish fills derived defaults: peers dial the internal IP unless told
// otherwise, and the default probe plugins target the kubelet settings.
func (c *Config) Finish() {
	for i := range c.Prober.Plugins {
		p := &c.Prober.Plugins[i]
		if p.Name == "kubelet-port" || p.Name == "kubelet-healthz" {
			p.Port = c.Kubelet.Port
		}
		if p.Name == "kubelet-healthz" {
			p.Scheme, p.TokenFile, p.CAFile, p.InsecureSkipVerify = c.Kubelet.Scheme, c.Kubelet.TokenFile, c.Kubelet.CAFile, c.Kubelet.InsecureSkipVerify
		}
	}
	if c.Proxy.StateDir == "" {
		c.Proxy.StateDir = c.Membership.StateDir
	}
	if c.NATS.RouteAdvertise == "" && c.Reporter.InternalIP != "" && c.NATS.RoutePort > 0 {
		c.NATS.RouteAdvertise = c.Reporter.InternalIP + ":" + strconv.Itoa(c.NATS.RoutePort)
	}
}

// Validate checks every component's configuration.
func (c Config) Validate() error {
	// The settings a first run is likely to miss, named by their flags.
	if c.NATS.NodeName == "" {
		return errors.New("--node-name is required (or $NODE_NAME, or $ATOLL_NODE_NAME)")
	}
	if len(c.NATS.HubURLs) == 0 {
		return errors.New("--hub-url is required: the hub's leafnode URL, nats-leaf://host:7422 (or $ATOLL_HUB_URL)")
	}
	for _, v := range []interface{ Validate() error }{c.Admin, c.NATS, c.Reporter, c.ViewFeed, c.Prober, c.Voter, c.Enroll, c.Proxy, c.Hosts} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if 2*c.Prober.RoundBudget > c.Voter.Timeout {
		return fmt.Errorf("probe round budget %v must be at most half the vote timeout %v, or reports go stale before the next round is out", c.Prober.RoundBudget, c.Voter.Timeout)
	}
	return nil
}

// Options is the atoll-edge application.
func Options(c Config, log *slog.Logger) fx.Option {
	// The one place that names the node in the agent's log lines: the
	// components' loggers inherit it and must not add it again.
	log = log.With("node", c.NATS.NodeName)
	return fx.Options(
		fx.Supply(c.Admin, c.NATS, c.Reporter, c.Membership, c.Prober, c.Voter, c.Enroll, c.ViewFeed, log),
		fx.WithLogger(fxrun.Logger(log)),
		admin.Module,
		natsnode.Module,
		enroll.Module,
		viewfeed.Module,
		membership.Module,
		reporter.Module,
		prober.Module,
		voter.Module,
		fx.Supply(c.Tunnel),
		edgetunnel.Module,
		fx.Provide(func(p *prober.Prober) reporter.ProbeSource { return p }),
		fx.Provide(func(m *membership.Membership) reporter.ViewSource { return m }),
		fx.Supply(c.Proxy, proxy.NodeName(c.NATS.NodeName)),
		proxy.Module,
		fx.Supply(c.Hosts),
		hosts.Module,
	)
}

// proxyAddr is the --proxy-addr flag: an address turns the proxy on.
type proxyAddr struct{ c *Config }

func (f proxyAddr) String() string {
	if f.c == nil || !f.c.Proxy.Enabled {
		return ""
	}
	return f.c.Proxy.Addr
}

func (f proxyAddr) Set(s string) error {
	f.c.Proxy.Addr, f.c.Proxy.Enabled = s, s != ""
	return nil
}
