package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atoll-edge/atoll/internal/eventbus"
	"github.com/atoll-edge/atoll/test/poll"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/cliflags"
	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
	"github.com/atoll-edge/atoll/test/natstest"
)

func TestDecode(t *testing.T) {
	v := &atollv1.Ballot{Voter: "a", Unit: "u1", Votes: []*atollv1.Vote{{Node: "b", Verdict: atollv1.Verdict_VERDICT_UNHEALTHY, Abnormal: 2}}}
	data, _ := proto.Marshal(v)
	tests := []struct {
		name string
		args []string
		in   []byte
		want string // substring of the output, or of the error
		fail bool
	}{
		{"by type", []string{"decode", "--type", "atoll.v1.Ballot"}, data, `"verdict": "VERDICT_UNHEALTHY"`, false},
		{"by subject", []string{"decode", "--subject", "atoll.health.ballot.u1.a", "--compact"}, data, `"voter":"a"`, false},
		{"garbage", []string{"decode", "--type", "atoll.v1.Ballot"}, []byte{0xff, 0xff}, "undecodable", true},
		{"unknown type", []string{"decode", "--type", "google.protobuf.Duration"}, data, "unknown message type", true},
		{"unknown subject", []string{"decode", "--subject", "foo.bar"}, data, "not in catalog", true},
		{"nothing", []string{"decode"}, data, "give --type or --subject", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(context.Background(), tt.args, bytes.NewReader(tt.in), &out)
			if tt.fail {
				if err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want %q", err, tt.want)
				}
				return
			}
			if err != nil || !strings.Contains(out.String(), tt.want) {
				t.Fatalf("out = %q, err = %v; want %q", out.String(), err, tt.want)
			}
		})
	}
}

func TestEventsTail(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	var out natstest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "tail", "--server", h.ClientURL(), "--creds", natstest.OperatorCreds(t, h.Issuer()), "atoll.health.>"}, nil, &out)
	}()
	subj, _ := events.BallotSubject("u1", "a")
	poll.Eventually(t, 10*time.Second, func() error {
		if err := events.Publish(nc, subj, &atollv1.Ballot{Voter: "a", Unit: "u1", Votes: []*atollv1.Vote{{Node: "b", Verdict: atollv1.Verdict_VERDICT_HEALTHY}}}, ""); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "VERDICT_HEALTHY") {
			return poll.Errorf("no decoded ballot in %q", out.String())
		}
		return nil
	})
	if err := nc.PublishMsg(&nats.Msg{Subject: "atoll.health.probe.u1.a", Data: []byte{0xff}}); err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 10*time.Second, func() error {
		if got := out.String(); !strings.Contains(got, "atoll.health.ballot.u1.a atoll.v1.Ballot {") || !strings.Contains(got, "undecodable") {
			return poll.Errorf("tail printed %q", got)
		}
		return nil
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tail did not stop when cancelled")
	}
}

// TestEventsTailViewsOnce: tailing everything shows a view once, as
// stored, not again as the hub republishes it.
func TestEventsTailViewsOnce(t *testing.T) {
	h := natstest.Hub(t)
	nc, err := h.Connect("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.NewWithDomain(nc, h.Domain())
	if err != nil {
		t.Fatal(err)
	}
	if err := eventbus.EnsureStreams(t.Context(), js, events.DefaultStreamOptions()); err != nil {
		t.Fatal(err)
	}
	var out natstest.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "tail", "--server", h.ClientURL(), "--creds", natstest.OperatorCreds(t, h.Issuer())}, nil, &out)
	}()
	subj, _ := events.UnitViewSubject("u1")
	poll.Eventually(t, 10*time.Second, func() error {
		if _, err := events.PublishDurable(t.Context(), js, subj, &atollv1.UnitView{Unit: "u1"}, ""); err != nil {
			return err
		}
		// A marker after the view's republished copy.
		if err := events.Publish(nc, "atoll.topo.node.m", &atollv1.TopologyUpdate{Node: "m"}, ""); err != nil {
			return err
		}
		// The view and a marker after its republished copy, both heard.
		if got := out.String(); !strings.Contains(got, subj+" ") || !strings.Contains(got[strings.Index(got, subj+" "):], "atoll.topo.node.m") {
			return poll.Errorf("no view and marker after it in %q", got)
		}
		return nil
	})
	if got := out.String(); strings.Contains(got, "atoll.viewpub.") {
		t.Fatalf("tail printed %q, want the stored view and not its republished copy", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
}

func TestEventsCatalog(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"events", "catalog"}, nil, &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != events.CatalogMarkdown() || !strings.Contains(out.String(), "| `atoll.cloud.status` |") {
		t.Fatalf("catalog:\n%s", out.String())
	}
	if err := run(context.Background(), []string{"events", "catalog", "extra"}, nil, &out); err == nil {
		t.Fatal("accepted an argument")
	}
	if err := run(context.Background(), []string{"events", "nope"}, nil, &out); !errors.As(err, new(cliflags.UsageError)) {
		t.Fatalf("unknown events command: %v", err)
	}
}
