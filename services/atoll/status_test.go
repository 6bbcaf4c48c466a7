package main

import (
	"github.com/atoll-edge/atoll/cloud/units"

	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/yaml"

	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/hub"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

func TestRenderStatus(t *testing.T) {
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	ts := func(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(at.Add(d)) }
	tests := []struct {
		name string
		cs   *atollv1.ClusterStatus
		want string
	}{

		{"units", &atollv1.ClusterStatus{Time: ts(0), Replica: "atoll-hub-0", TunnelReplicas: 2, Units: []*atollv1.UnitStatus{
			{Unit: "site-a", State: "PartialDisruption", Nodes: []*atollv1.NodeStatus{
				{Name: "site-a-1", Ready: "True", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 2, Normal: 2, Checkers: 2, LastVote: ts(-1500 * time.Millisecond), TunnelSessions: 12,
					ProbeRefusals: []*atollv1.ProbeRefusal{{Plugin: "kubelet-healthz", Peer: "site-a-3", Status: "401 Unauthorized"}}},
				{Name: "site-a-2", Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 1, UndecidedVotes: 1, Normal: 1, Abnormal: 1, Checkers: 2, LastVote: ts(-90 * time.Second), Protected: true, ViewsBehind: "unit view",
					ProbeRefusals: []*atollv1.ProbeRefusal{{Plugin: "extra", Peer: "site-a-1", Status: "403 Forbidden"}, {Plugin: "kubelet-healthz", Peer: "site-a-3", Status: "401 Unauthorized"}}},
				{Name: "site-a-3", Ready: "False", Verdict: atollv1.Verdict_VERDICT_UNHEALTHY, UnhealthyVotes: 2, Abnormal: 2, Checkers: 2, LastVote: ts(time.Second)},
			}},
			{Unit: "site-b", State: "FullDisruption", HoldUntil: ts(9*time.Minute + 58*time.Second), Nodes: []*atollv1.NodeStatus{
				{Name: "site-b-1", Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_NONE, Protected: true, ViewsBehind: "unknown"},
			}},
			{Unit: "site-c", State: "FullDisruption", HoldUntil: ts(-3 * time.Second), Nodes: []*atollv1.NodeStatus{
				{Name: "c", Ready: "Unknown"},
			}},
		}}, `UNIT    STATE              HOLD-UNTIL
site-a  PartialDisruption  -
  NODE      CLOUD    VERDICT    VOTES(h/u/n)  CHECKERS(normal/abnormal/total)  AGE    PROTECTED  VIEWS              TUNNELS  PROBE-CREDENTIALS
  site-a-1  True     healthy    2/0/0         2/0/2                            2s     no         current            12       refused by site-a-3 (401 Unauthorized)
  site-a-2  Unknown  healthy    1/0/1         1/1/2                            1m30s  yes        behind: unit view  0        extra refused by site-a-1 (403 Forbidden), kubelet-healthz refused by site-a-3 (401 Unauthorized)
  site-a-3  False    unhealthy  0/2/0         0/2/2                            0s     no         current            0        -

UNIT    STATE           HOLD-UNTIL
site-b  FullDisruption  2026-05-01T10:09:58Z (in 9m58s)
  NODE      CLOUD    VERDICT  VOTES(h/u/n)  CHECKERS(normal/abnormal/total)  AGE  PROTECTED  VIEWS    TUNNELS  PROBE-CREDENTIALS
  site-b-1  Unknown  none     0/0/0         0/0/0                            -    yes        unknown  0        -

UNIT    STATE           HOLD-UNTIL
site-c  FullDisruption  2026-05-01T09:59:57Z (ended 3s ago)
  NODE  CLOUD    VERDICT  VOTES(h/u/n)  CHECKERS(normal/abnormal/total)  AGE  PROTECTED  VIEWS    TUNNELS  PROBE-CREDENTIALS
  c     Unknown  none     0/0/0         0/0/0                            -    no         current  0        -
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := renderStatus(&out, tt.cs, painter{}); err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.want {
				t.Fatalf("rendered:\n%s\nwant:\n%s", out.String(), tt.want)
			}
		})
	}
}

// fakeHealth: u1 has a lost node its peers keep, u2 is silent and held,
// u3's n4 has no peer verdict.
type fakeHealth struct{ hold time.Time }

func (fakeHealth) Tally(node string) health.Tally {
	if node == "n2" || node == "n5" {
		return health.Tally{Verdict: atollv1.Verdict_VERDICT_HEALTHY, Healthy: 2, Normal: 2, Checkers: 2, LastVote: time.Now()}
	}
	return health.Tally{Verdict: atollv1.Verdict_VERDICT_NONE}
}
func (fakeHealth) Protected(node string) bool { return node == "n2" || node == "n3" }
func (f fakeHealth) UnitState(unit string) (health.UnitState, time.Time) {
	switch unit {
	case "u2":
		return health.FullDisruption, f.hold
	case "u3":
		return health.Normal, time.Time{}
	}
	return health.PartialDisruption, time.Time{}
}

// fakeAgents: n5's agent reports n4 refusing its kubelet token; no agent
// tells its views.
type fakeAgents struct{}

func (fakeAgents) ViewsBehind(string) string { return "unknown" }
func (fakeAgents) ProbeRefusals(node string) []*atollv1.ProbeRefusal {
	if node == "n5" {
		return []*atollv1.ProbeRefusal{{Plugin: "kubelet-healthz", Peer: "n4", Status: "401 Unauthorized"}}
	}
	return nil
}

func startResponder(t *testing.T, h *hub.Hub) {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range []struct{ name, unit, ready string }{{"n2", "u1", "Unknown"}, {"n1", "u1", "True"}, {"n3", "u2", "Unknown"}, {"n4", "u3", "True"}, {"n5", "u3", "True"}, {"cp", "", "True"}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{}}}
		if n.unit != "" {
			node.Labels[wellknown.LabelUnit] = n.unit
		}
		node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionStatus(n.ready)}}
		if err := idx.Add(node); err != nil {
			t.Fatal(err)
		}
	}
	r, err := status.New(fakeHealth{hold: time.Now().Add(10 * time.Minute)}, corelisters.NewNodeLister(idx), units.DefaultRule(), natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	r.SetViews(fakeAgents{})
	nc, err := h.Connect("atoll-cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := r.Start(nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
}

func TestStatusCommand(t *testing.T) {
	h := natstest.Hub(t)
	login := []string{"--server", h.ClientURL(), "--creds", natstest.OperatorCreds(t, h.Issuer())}
	runStatus := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append(append([]string{"status"}, login...), args...), nil, &out)
		return out.String(), err
	}

	// Nobody subscribed yet.
	if _, err := runStatus("--timeout", "1s"); err == nil || !strings.Contains(err.Error(), "no atoll-cloud answered on atoll.cloud.status within 1s") {
		t.Fatalf("without a responder: %v", err)
	}

	startResponder(t, h)
	tests := []struct {
		name  string
		args  []string
		lines []string // each must appear as is
		not   []string
		match string // a regexp the output must match, if set
	}{
		{"verdict and units", nil, []string{
			"AT RISK: 3 units, 5 nodes; unit u2 partitioned (hold ends ",
			"; node n4 has no peer verdict; node n5's kubelet probe credentials refused by n4 (401 Unauthorized): fix --kubelet-token-file (get nodes/healthz); 1 node protected (cloud link lost, peers healthy)\n\nUNIT  SAFETY    STATE ",
			"\nu1    SAFE      PartialDisruption  2      1      1              1          -  ",
			"  protected: n2\n",
			"\nu3    DEGRADED  Normal             2      2      1              0          -  ",
			"  no peer verdict: n4; probe credentials refused: n5\n",
			"\nu2    AT RISK   FullDisruption     1      0      0              1          ",
		}, []string{"cp", "VOTES", "\x1b"}, ""},
		{"every unit, wide", []string{"-o", "wide"}, []string{
			"AT RISK: 3 units, 5 nodes; unit u2 partitioned (hold ends ",
			"UNIT  STATE              HOLD-UNTIL\nu1    PartialDisruption  -\n",
			"  n1    True     none     0/0/0         0/0/0                            -    no",
			"  n2    Unknown  healthy  2/0/0         2/0/2                            0s   yes",
			"u2    FullDisruption  ",
			"  n3    Unknown  none     0/0/0         0/0/0                            -    yes",
			"  n5    True   healthy  2/0/0         2/0/2                            0s   no         unknown  0        refused by n4 (401 Unauthorized)\n",
		}, []string{"cp"}, `\nu2    FullDisruption  \S+ \(in (10m0s|9m\d+s)\)\n`}, // a hold of 10 minutes from the responder's start

		{"one unit", []string{"--unit", "u1", "--output=wide"}, []string{"SAFE: unit u1, 2 nodes; 1 node protected (cloud link lost, peers healthy); no unit partitioned\n", "u1    PartialDisruption  -"}, []string{"u2"}, ""},
		{"colour always", []string{"--unit", "u3", "--color=always"}, []string{"\x1b[33mDEGRADED\x1b[0m: unit u3, 2 nodes; node n4 has no peer verdict;", "\x1b[33mDEGRADED\x1b[0m  Normal"}, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := runStatus(tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range tt.lines {
				if !strings.Contains(out, l) {
					t.Errorf("no %q in\n%s", l, out)
				}
			}
			for _, s := range tt.not {
				if strings.Contains(out, s) {
					t.Errorf("%q in\n%s", s, out)
				}
			}
			if tt.match != "" && !regexp.MustCompile(tt.match).MatchString(out) {
				t.Errorf("no match for %s in\n%s", tt.match, out)
			}
		})
	}

	for _, flags := range [][]string{{"-o", "json"}, {"--json"}, {"--json", "-o", "json"}, {"-o", "yaml"}} {
		t.Run(strings.Join(flags, " "), func(t *testing.T) {
			out, err := runStatus(append(flags, "--unit", "u2", "--color=always")...)
			if err != nil {
				t.Fatal(err)
			}
			js := []byte(out)
			if flags[len(flags)-1] == "yaml" {
				if !strings.Contains(out, "  state: FullDisruption\n") {
					t.Fatalf("yaml:\n%s", out)
				}
				if js, err = yaml.YAMLToJSON(js); err != nil {
					t.Fatalf("%v in\n%s", err, out)
				}
			} else if !strings.Contains(out, `"state": "FullDisruption"`) {
				t.Fatalf("json:\n%s", out)
			}
			var cs atollv1.ClusterStatus
			if err := protojson.Unmarshal(js, &cs); err != nil {
				t.Fatalf("%v in\n%s", err, out)
			}
			if len(cs.GetUnits()) != 1 || cs.GetUnits()[0].GetUnit() != "u2" || cs.GetUnits()[0].GetHoldUntil() == nil ||
				cs.GetReplica() != "atoll-hub-0" || !cs.GetUnits()[0].GetNodes()[0].GetProtected() || strings.Contains(out, "\x1b") {
				t.Fatalf("%s:\n%s", flags, out)
			}
		})
	}

	// The refusals reach JSON and YAML as the ClusterStatus carries them.
	for _, output := range []string{"json", "yaml"} {
		t.Run("refusals in "+output, func(t *testing.T) {
			out, err := runStatus("-o", output, "--unit", "u3")
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]string{
				"json": `"probe_refusals": [`,
				"yaml": "    probe_refusals:\n    - peer: n4\n      plugin: kubelet-healthz\n      status: 401 Unauthorized\n",
			}[output]
			if !strings.Contains(out, want) {
				t.Fatalf("no %q in\n%s", want, out)
			}
		})
	}

	// On a pipe, auto colour is off.
	t.Run("pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		errc := make(chan error, 1)
		go func() {
			errc <- run(context.Background(), append(append([]string{"status"}, login...), "-o", "wide"), nil, w)
			w.Close()
		}()
		out, _ := io.ReadAll(r)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(out), "AT RISK: 3 units") || strings.Contains(string(out), "\x1b") {
			t.Fatalf("on a pipe:\n%q", out)
		}
	})

	t.Run("exit code", func(t *testing.T) {
		for _, tt := range []struct {
			args []string
			code int
		}{{nil, 0}, {[]string{"--exit-code"}, ExitAtRisk}, {[]string{"--exit-code", "--unit", "u3"}, ExitDegraded}, {[]string{"--exit-code", "--unit", "u1"}, 0}, {[]string{"--exit-code", "-o", "json"}, ExitAtRisk}} {
			code, stdout, stderr := cli(t, append(append([]string{"status"}, login...), tt.args...)...)
			if code != tt.code || stderr != "" || stdout == "" {
				t.Errorf("%v: exit %d, stderr %q, want exit %d", tt.args, code, stderr, tt.code)
			}
		}
	})

	t.Run("unknown unit", func(t *testing.T) {
		if _, err := runStatus("--unit", "nope"); err == nil || !strings.Contains(err.Error(), `knows no unit "nope"`) {
			t.Fatalf("err = %v", err)
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		if _, err := runStatus("u1"); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Fatalf("err = %v", err)
		}
		if _, err := runStatus("--timeout", "0s"); err == nil || !strings.Contains(err.Error(), "--timeout") {
			t.Fatalf("err = %v", err)
		}
		if _, err := runStatus("--json", "-o", "yaml"); err == nil || !strings.Contains(err.Error(), "--json and -o yaml: give one") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestStatusCommandReplies(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("fake-cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A responder that takes requests and answers according to the unit
	// asked for: silence, an error reply, or a payload of the wrong type.
	sub, err := nc.Subscribe(events.StatusSubject, func(m *nats.Msg) {
		var req atollv1.StatusRequest
		if err := events.DecodeMsg(m, &req); err != nil {
			return
		}
		switch req.GetUnit() {
		case "silent":
		case "refused":
			r := nats.NewMsg(m.Reply)
			r.Header.Set(micro.ErrorHeader, "status: list nodes: boom")
			r.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(500))
			_ = m.RespondMsg(r)
		case "wrong":
			r, _ := events.NewMsg(m.Reply, &atollv1.Vote{}, "")
			_ = m.RespondMsg(r)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ unit, want string }{
		{"silent", "no atoll-cloud answered on atoll.cloud.status within 200ms"},
		{"refused", "atoll-cloud refused the status request (code 500): status: list nodes: boom"},
		{"wrong", "message type mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.unit, func(t *testing.T) {
			err := run(context.Background(), []string{"status", "--server", h.ClientURL(), "--creds", natstest.OperatorCreds(t, h.Issuer()), "--timeout", "200ms", "--unit", tt.unit}, nil, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}
