package status_test

import (
	"github.com/atoll-edge/atoll/cloud/units"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/wellknown"

	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"go.uber.org/fx"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/atoll-edge/atoll/cloud/cloudapp"
	"github.com/atoll-edge/atoll/cloud/health"
	"github.com/atoll-edge/atoll/cloud/status"
	"github.com/atoll-edge/atoll/cloud/views/members"
	"github.com/atoll-edge/atoll/events"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

const unitLabel = wellknown.LabelUnit

var (
	t0   = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)
	hold = t0.Add(10 * time.Minute)
)

type unitState struct {
	state health.UnitState
	hold  time.Time
}

// fakeHealth answers from fixed maps.
type fakeHealth struct {
	tallies   map[string]health.Tally
	units     map[string]unitState
	protected map[string]bool
}

func (f fakeHealth) Tally(node string) health.Tally { return f.tallies[node] }
func (f fakeHealth) Protected(node string) bool     { return f.protected[node] }
func (f fakeHealth) UnitState(unit string) (health.UnitState, time.Time) {
	if s, ok := f.units[unit]; ok {
		return s.state, s.hold
	}
	return health.Normal, time.Time{}
}

func node(name, unit string, ready corev1.ConditionStatus) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
	if unit != "" {
		n.Labels[unitLabel] = unit
	}
	if ready != "" {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}
	}
	return n
}

func lister(t *testing.T, nodes ...*corev1.Node) corelisters.NodeLister {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, n := range nodes {
		if err := idx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewNodeLister(idx)
}

// fixture: unit u1 partially disrupted (b lost but protected by its
// peers), unit u2 fully disrupted and held, a control-plane node without
// a unit, and a node whose Ready condition is missing.
func fixture(t *testing.T) (status.Health, corelisters.NodeLister) {
	h := fakeHealth{
		tallies: map[string]health.Tally{
			"a": {Verdict: atollv1.Verdict_VERDICT_HEALTHY, Healthy: 2, Normal: 2, Checkers: 2, Since: t0.Add(-time.Hour), LastVote: t0.Add(-2 * time.Second)},
			"b": {Verdict: atollv1.Verdict_VERDICT_HEALTHY, Healthy: 1, Undecided: 1, Normal: 1, Abnormal: 1, Checkers: 2, Since: t0.Add(-time.Minute), LastVote: t0.Add(-time.Second)},
			"c": {Verdict: atollv1.Verdict_VERDICT_NONE, Since: time.Unix(0, 0)},
		},
		units:     map[string]unitState{"u1": {health.PartialDisruption, time.Time{}}, "u2": {health.FullDisruption, hold}},
		protected: map[string]bool{"b": true, "d": true},
	}
	return h, lister(t,
		node("b", "u1", corev1.ConditionUnknown),
		node("d", "u2", corev1.ConditionUnknown),
		node("control-plane", "", corev1.ConditionTrue),
		node("a", "u1", corev1.ConditionTrue),
		node("c", "u1", ""),
	)
}

func want(units ...*atollv1.UnitStatus) *atollv1.ClusterStatus {
	return &atollv1.ClusterStatus{Units: units}
}

// check compares got with want after checking and dropping got's time.
func check(t *testing.T, want, got *atollv1.ClusterStatus) {
	t.Helper()
	if at := got.GetTime().AsTime(); !got.GetTime().IsValid() || time.Since(at) > time.Minute || time.Until(at) > time.Minute {
		t.Errorf("time = %v, want about now", got.GetTime())
	}
	got = proto.Clone(got).(*atollv1.ClusterStatus)
	got.Time = nil
	if !proto.Equal(want, got) {
		t.Fatalf("status:\n%s\nwant:\n%s", prototext.Format(got), prototext.Format(want))
	}
}

var (
	u1 = &atollv1.UnitStatus{Unit: "u1", State: "PartialDisruption", Nodes: []*atollv1.NodeStatus{
		{Name: "a", Ready: "True", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 2, Normal: 2, Checkers: 2,
			VerdictSince: timestamppb.New(t0.Add(-time.Hour)), LastVote: timestamppb.New(t0.Add(-2 * time.Second)),
			ProbeRefusals: []*atollv1.ProbeRefusal{refusal}},
		{Name: "b", Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_HEALTHY, HealthyVotes: 1, UndecidedVotes: 1, Normal: 1, Abnormal: 1, Checkers: 2,
			VerdictSince: timestamppb.New(t0.Add(-time.Minute)), LastVote: timestamppb.New(t0.Add(-time.Second)), Protected: true, ViewsBehind: "unit view"},
		{Name: "c", Ready: "Unknown", Verdict: atollv1.Verdict_VERDICT_NONE, ViewsBehind: "unknown"},
	}}
	u2 = &atollv1.UnitStatus{Unit: "u2", State: "FullDisruption", HoldUntil: timestamppb.New(hold), Nodes: []*atollv1.NodeStatus{
		{Name: "d", Ready: "Unknown", Protected: true, ViewsBehind: "assignment, unit view", NoKey: true},
	}}
)

func newResponder(t *testing.T) *status.Responder {
	t.Helper()
	h, nodes := fixture(t)
	r, err := status.New(h, nodes, units.DefaultRule(), natstest.Logger(t, slog.LevelWarn))
	if err != nil {
		t.Fatal(err)
	}
	r.SetViews(agents{
		behind:   map[string]string{"b": "unit view", "c": "unknown", "d": "assignment, unit view"},
		refusals: map[string][]*atollv1.ProbeRefusal{"a": {refusal}},
	})
	// No key for c (whose agent has not reported: not said) and d.
	r.SetKeys(keys{"a": "UA", "b": "UB"})
	return r
}

// keys are the identity service's valid keys by node.
type keys map[string]string

func (k keys) NodeKey(node string) (string, bool) { key, ok := k[node]; return key, ok }

// refusal: a's agent reports b refusing its kubelet token.
var refusal = &atollv1.ProbeRefusal{Plugin: "kubelet-healthz", Peer: "b", Status: "401 Unauthorized"}

// agents are the members service's answers per node: the views behind
// ("": current) and the refused probe credentials.
type agents struct {
	behind   map[string]string
	refusals map[string][]*atollv1.ProbeRefusal
}

func (a agents) ViewsBehind(node string) string { return a.behind[node] }
func (a agents) ProbeRefusals(node string) []*atollv1.ProbeRefusal {
	return a.refusals[node]
}

func TestStatus(t *testing.T) {
	r := newResponder(t)
	tests := []struct {
		name string
		unit string
		want *atollv1.ClusterStatus
	}{
		{"every unit", "", want(u1, u2)},
		{"one unit", "u2", want(u2)},
		{"unknown unit", "nope", want()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := r.Status(tt.unit)
			if err != nil {
				t.Fatal(err)
			}
			check(t, tt.want, got)
		})
	}
}

func TestNewRejects(t *testing.T) {
	h, nodes := fixture(t)
	log := natstest.Logger(t, slog.LevelWarn)
	if _, err := status.New(h, nodes, units.Rule{}, log); err == nil {
		t.Error("accepted an empty unit label")
	}
	if _, err := status.New(nil, nodes, units.DefaultRule(), log); err == nil {
		t.Error("accepted no health service")
	}
	if _, err := status.New(h, nil, units.DefaultRule(), log); err == nil {
		t.Error("accepted no node lister")
	}
}

func TestResponder(t *testing.T) {
	hub := natstest.Hub(t)
	svc, err := hub.Connect("atoll-cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	client, err := hub.Connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	r := newResponder(t)
	if err := r.Start(svc); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(svc); err == nil {
		t.Fatal("started twice")
	}

	request := func(t *testing.T, m *nats.Msg) *nats.Msg {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		reply, err := client.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatalf("request: %v", err)
		}
		return reply
	}
	statusMsg := func(t *testing.T, req *atollv1.StatusRequest) *nats.Msg {
		t.Helper()
		m, err := events.NewMsg(events.StatusSubject, req, "")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	withReplica := func(cs *atollv1.ClusterStatus) *atollv1.ClusterStatus {
		cs = proto.Clone(cs).(*atollv1.ClusterStatus)
		cs.Replica = "atoll-hub-0" // the hub's server name
		cs.TunnelReplicas = 1      // itself, on the tunnels endpoint, with no session
		return cs
	}

	ok := []struct {
		name string
		msg  *nats.Msg
		want *atollv1.ClusterStatus
	}{
		{"empty payload", nats.NewMsg(events.StatusSubject), withReplica(want(u1, u2))},
		{"every unit", statusMsg(t, &atollv1.StatusRequest{}), withReplica(want(u1, u2))},
		{"one unit", statusMsg(t, &atollv1.StatusRequest{Unit: "u1"}), withReplica(want(u1))},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			reply := request(t, tt.msg)
			if e := reply.Header.Get(micro.ErrorHeader); e != "" {
				t.Fatalf("error reply: %s", e)
			}
			if typ := reply.Header.Get(events.HeaderType); typ != "atoll.v1.ClusterStatus" {
				t.Fatalf("%s = %q", events.HeaderType, typ)
			}
			var got atollv1.ClusterStatus
			if err := events.DecodeMsg(reply, &got); err != nil {
				t.Fatal(err)
			}
			check(t, tt.want, &got)
		})
	}

	bad := []struct {
		name string
		msg  *nats.Msg
	}{
		{"garbage", &nats.Msg{Subject: events.StatusSubject, Data: []byte{0xff, 0xff}}},
		{"wrong type", func() *nats.Msg {
			m, _ := events.NewMsg(events.StatusSubject, &atollv1.Vote{}, "")
			return m
		}()},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			reply := request(t, tt.msg)
			if code := reply.Header.Get(micro.ErrorCodeHeader); code != "400" {
				t.Fatalf("%s = %q (%s), want 400", micro.ErrorCodeHeader, code, reply.Header.Get(micro.ErrorHeader))
			}
			if reply.Header.Get(micro.ErrorHeader) == "" || len(reply.Data) != 0 {
				t.Fatalf("error reply: headers %v, %d bytes", reply.Header, len(reply.Data))
			}
		})
	}

	// Still answering after bad input.
	if reply := request(t, nats.NewMsg(events.StatusSubject)); reply.Header.Get(micro.ErrorHeader) != "" {
		t.Fatalf("error after bad input: %v", reply.Header)
	}

	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := client.RequestMsgWithContext(ctx, nats.NewMsg(events.StatusSubject))
		if !errors.Is(err, nats.ErrNoResponders) {
			return poll.Errorf("after Stop: %v, want no responders", err)
		}
		return nil
	})
	if err := r.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

// TestModuleInCloudApp checks that atoll-cloud's graph with the kubernetes
// membership source provides everything the status module needs.
func TestModuleInCloudApp(t *testing.T) {
	cfg := cloudapp.Default()
	cfg.Members.Source = members.SourceKubernetes
	if err := fx.ValidateApp(cloudapp.Options(cfg, natstest.Logger(t, slog.LevelWarn)), fx.Populate(new(*status.Responder))); err != nil {
		t.Fatal(err)
	}
	if err := fx.ValidateApp(status.Module); err == nil {
		t.Fatal("status.Module validated without its dependencies")
	}
}

// TestServiceDiscovery: the responder is a micro service that `nats micro
// ls`/`info`/`stats` find through $SRV discovery; two replicas are two
// instances of atoll-cloud sharing the status endpoint's queue group.
func TestServiceDiscovery(t *testing.T) {
	hub := natstest.Hub(t)
	for i := range 2 {
		nc, err := hub.Connect("atoll-cloud-" + strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		r := newResponder(t)
		if err := r.Start(nc); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
	}
	client, err := hub.Connect("nats-cli")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	// Like `nats micro ls`: one request on $SRV.INFO, every instance answers.
	discover := func(verb micro.Verb, into func([]byte) error) int {
		t.Helper()
		subj, err := micro.ControlSubject(verb, "", "")
		if err != nil {
			t.Fatal(err)
		}
		inbox := client.NewRespInbox()
		sub, err := client.SubscribeSync(inbox)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := client.PublishRequest(subj, inbox, nil); err != nil {
			t.Fatal(err)
		}
		n := 0
		for {
			m, err := sub.NextMsg(500 * time.Millisecond)
			if errors.Is(err, nats.ErrTimeout) {
				return n
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := into(m.Data); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	ids := map[string]bool{}
	if n := discover(micro.InfoVerb, func(b []byte) error {
		var info micro.Info
		if err := json.Unmarshal(b, &info); err != nil {
			return err
		}
		if info.Name != events.CloudService || info.Version != events.CloudServiceVersion || info.Type != micro.InfoResponseType {
			return fmt.Errorf("info %+v", info)
		}
		if len(info.Endpoints) != 2 {
			return fmt.Errorf("endpoints %+v", info.Endpoints)
		}
		e := info.Endpoints[0]
		if e.Name != "status" || e.Subject != events.StatusSubject || e.QueueGroup != status.QueueGroup ||
			e.Metadata["request"] != "atoll.v1.StatusRequest" || e.Metadata["reply"] != "atoll.v1.ClusterStatus" {
			return fmt.Errorf("status endpoint %+v", e)
		}
		// Every replica answers the tunnels endpoint: no queue group.
		if e := info.Endpoints[1]; e.Name != "tunnels" || e.Subject != events.TunnelsSubject || e.QueueGroup != "" ||
			e.Metadata["request"] != "atoll.v1.TunnelSessionsRequest" || e.Metadata["reply"] != "atoll.v1.TunnelSessions" {
			return fmt.Errorf("tunnels endpoint %+v", e)
		}
		ids[info.ID] = true
		return nil
	}); n != 2 || len(ids) != 2 {
		t.Fatalf("$SRV.INFO: %d answers from %d instances, want 2 and 2", n, len(ids))
	}

	// `nats micro stats atoll-cloud` counts the requests.
	if err := events.Request(context.Background(), client, events.StatusSubject, &atollv1.StatusRequest{}, &atollv1.ClusterStatus{}); err != nil {
		t.Fatal(err)
	}
	// One replica took the status request and asked both for their
	// tunnel sessions. (A micro service counts a request once its
	// handler has returned, after the reply went out: ask until the
	// counts are in.)
	subj, _ := micro.ControlSubject(micro.StatsVerb, events.CloudService, "")
	poll.Eventually(t, 5*time.Second, func() error {
		requests := map[string]int{}
		if n := discover(micro.StatsVerb, func(b []byte) error {
			var st micro.Stats
			if err := json.Unmarshal(b, &st); err != nil {
				return err
			}
			for _, e := range st.Endpoints {
				requests[e.Name] += e.NumRequests
			}
			return nil
		}); n != 2 || requests["status"] != 1 || requests["tunnels"] != 2 {
			return fmt.Errorf("%s: %d answers counting %v requests, want 2 and status 1, tunnels 2", subj, n, requests)
		}
		return nil
	})
}

// brokenLister fails every list, so the status cannot be built.
type brokenLister struct{ corelisters.NodeLister }

func (brokenLister) List(labels.Selector) ([]*corev1.Node, error) {
	return nil, errors.New("informer not synced")
}

// TestTypedErrors: a bad request and a failing status come back as micro
// typed errors (code and description in headers), which events.Request
// turns into *events.ServiceError.
func TestTypedErrors(t *testing.T) {
	hub := natstest.Hub(t)
	svc, err := hub.Connect("atoll-cloud")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	h, _ := fixture(t)
	r, err := status.New(h, brokenLister{}, units.DefaultRule(), natstest.Logger(t, slog.LevelError+1))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(svc); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Stop() }()
	client, err := hub.Connect("operator")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	err = events.Request(ctx, client, events.StatusSubject, &atollv1.StatusRequest{}, &atollv1.ClusterStatus{})
	var se *events.ServiceError
	if !errors.As(err, &se) || se.Code != events.CodeInternal || !strings.Contains(se.Description, "informer not synced") {
		t.Fatalf("failing status: %v, want a 500 service error", err)
	}
	err = events.Request(ctx, client, events.StatusSubject, &atollv1.Vote{}, &atollv1.ClusterStatus{})
	if !errors.As(err, &se) || se.Code != events.CodeBadRequest || !strings.Contains(se.Description, "message type mismatch") {
		t.Fatalf("wrong request type: %v, want a 400 service error", err)
	}
	reply, err := client.RequestMsgWithContext(ctx, &nats.Msg{Subject: events.StatusSubject, Data: []byte{0xff}})
	if err != nil {
		t.Fatal(err)
	}
	if err := events.ReplyError(reply); !errors.As(err, &se) || se.Code != events.CodeBadRequest || len(reply.Data) != 0 {
		t.Fatalf("garbage: %v (%d bytes)", err, len(reply.Data))
	}
}
