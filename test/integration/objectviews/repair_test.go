// Package objectviews_test runs the cloud's object view publisher and an
// edge endpoints proxy on one hub.
package objectviews_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/atoll-edge/atoll/cloud/manager"
	"github.com/atoll-edge/atoll/cloud/views/objects"
	"github.com/atoll-edge/atoll/edge/proxy"
	"github.com/atoll-edge/atoll/edge/viewfeed"
	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/internal/hublink"
	"github.com/atoll-edge/atoll/internal/objectview"
	"github.com/atoll-edge/atoll/internal/wellknown"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/kubetest"
	"github.com/atoll-edge/atoll/test/natstest"
	"github.com/atoll-edge/atoll/test/poll"
)

type staticUnit string

func (u staticUnit) Unit() string           { return string(u) }
func (staticUnit) Changes() <-chan struct{} { return nil }

// TestFreshEdgeAfterGarbage: a real apiserver, the object view publisher
// on a real hub, and views that no edge can serve stored over a live
// Service's and its slice's subjects (as a faulty writer might): the
// publisher stores the right views again at once, and an edge proxy
// started afterwards from nothing (no state) serves the Service, the
// slice and the node's Node.
func TestFreshEdgeAfterGarbage(t *testing.T) {
	cluster := kubetest.Start(t)
	h := natstest.Hub(t)
	log := natstest.Logger(t, slog.LevelWarn)
	ctx := t.Context()
	kc := cluster.Client()

	nc, err := h.Connect("cloud")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(ctx, js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	mcfg := manager.DefaultConfig()
	mcfg.LeaderElect = false
	m, err := manager.New(mcfg, cluster.RESTConfig(), log)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := objects.New(objects.DefaultConfig(), m.GetClient(), hublink.Of(nc, js), log, nil, h.Issuer().ViewSigner())
	if err != nil {
		t.Fatal(err)
	}
	if err := pub.SetupWithManager(m); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	if err := m.Start(sctx); err != nil {
		t.Fatal(err)
	}
	scancel()
	t.Cleanup(func() { _ = m.Stop(context.Background()) })
	pctx, pstop := context.WithCancel(context.Background())
	pdone := make(chan struct{})
	go func() { defer close(pdone); _ = pub.Run(pctx) }()
	t.Cleanup(func() { pstop(); <-pdone })

	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels: map[string]string{wellknown.LabelUnit: "u1", "zone": "z1"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", Annotations: map[string]string{wellknown.TopologyKeysAnnotation: "zone"}},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.1.0.1"}, NodeName: ptr.To("n1")}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	views, err := js.Stream(ctx, events.StreamViews)
	if err != nil {
		t.Fatal(err)
	}
	subjects := []string{"atoll.view._all.services.default.web", "atoll.view._all.endpointslices.default.web-1", "atoll.view.u1.nodes._.n1"}
	stored := func() error {
		for _, subj := range subjects {
			raw, err := views.GetLastMsgForSubject(ctx, subj)
			if err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
			if err := servable(raw.Data); err != nil {
				return fmt.Errorf("%s: %w", subj, err)
			}
		}
		return nil
	}
	poll.Eventually(t, 30*time.Second, stored)

	garbage := time.Now()
	for _, subj := range subjects[:2] {
		if _, err := js.Publish(ctx, subj, []byte("\xff\x00 not a view")); err != nil {
			t.Fatal(err)
		}
	}
	poll.Eventually(t, 20*time.Second, stored)
	t.Logf("the publisher stored the right views %v after the garbage", time.Since(garbage).Round(time.Millisecond))

	// A fresh edge: n1's server and its proxy, no state.
	edge := natstest.Unit(t, h, "u1", natstest.EdgeOptions{}, "n1")[0]
	enc, err := edge.Connect("proxy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(enc.Close)
	ejs, err := jetstream.NewWithDomain(enc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	feeds, err := viewfeed.NewFeeds(viewfeed.DefaultConfig(), hublink.Of(enc, ejs), edge, log, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := proxy.DefaultConfig()
	cfg.Enabled, cfg.Addr = true, "127.0.0.1:0"
	px, err := proxy.New(cfg, "n1", feeds, staticUnit("u1"), log, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := px.Listen(); err != nil {
		t.Fatal(err)
	}
	xctx, xstop := context.WithCancel(context.Background())
	xdone := make(chan struct{})
	go func() { defer close(xdone); _ = px.Run(xctx) }()
	t.Cleanup(func() { xstop(); <-xdone })
	started := time.Now()
	poll.Eventually(t, 20*time.Second, func() error {
		for _, o := range []struct{ kind, ns, name string }{
			{objectview.KindServices, "default", "web"}, {objectview.KindEndpointSlices, "default", "web-1"}, {objectview.KindNodes, "", "n1"},
		} {
			if _, ok := px.Store().Get(o.kind, o.ns, o.name); !ok {
				return fmt.Errorf("the fresh proxy does not serve %s %s/%s", o.kind, o.ns, o.name)
			}
		}
		return nil
	})
	t.Logf("a fresh proxy served the objects %v after it started", time.Since(started).Round(time.Millisecond))
}

// servable says why a stored view cannot be served.
func servable(data []byte) error {
	v := &atollv1.ObjectView{}
	if err := proto.Unmarshal(data, v); err != nil {
		return err
	}
	if v.GetDeleted() {
		return errors.New("a tombstone")
	}
	obj, err := objectview.Decode(v)
	if err != nil {
		return err
	}
	_, err = objectview.DecodeEndpointTopology(obj)
	return err
}
