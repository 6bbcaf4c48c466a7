package health

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	atollv1 "github.com/atoll-edge/atoll/schemas/atoll/v1"
)

// TestLeafLinkEvents: which connection events are an edge node's link
// opening or closing, and which closes a hub server's shutdown caused (the
// node moves to another server; its votes are not cut).
func TestLeafLinkEvents(t *testing.T) {
	start := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	stop := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ev := func(kind string, reason server.ClosedState, tags ...string) server.DisconnectEventMsg {
		var m server.DisconnectEventMsg
		m.Time = stop.Add(time.Second)
		m.Server.Name = "atoll-hub-1"
		m.Client.Kind = kind
		m.Client.Tags = tags
		m.Client.Start = &start
		m.Client.Stop = &stop
		m.Reason = reason.String()
		return m
	}
	tests := []struct {
		name           string
		ev             server.DisconnectEventMsg
		loss, shutdown bool
	}{
		{"edge leaf, read error", ev("Leafnode", server.ReadError, "role:edge", "name:e1"), true, false},
		{"edge leaf, stale", ev("Leafnode", server.StaleConnection, "role:edge", "name:e1"), true, false},
		{"edge leaf, revoked", ev("Leafnode", server.Revocation, "role:edge", "name:e1"), true, false},
		{"edge leaf, server shutting down", ev("Leafnode", server.ServerShutdown, "role:edge", "name:e1"), true, true},
		{"client, not a leaf", ev("Client", server.ReadError, "role:edge", "name:e1"), false, false},
		{"leaf of no edge role", ev("Leafnode", server.ReadError, "name:e1"), false, false},
		{"edge leaf without a name", ev("Leafnode", server.ReadError, "role:edge"), false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, ok := leafLink(tt.ev, true)
			if ok != tt.loss {
				t.Fatalf("loss = %v, want %v", ok, tt.loss)
			}
			if !ok {
				return
			}
			if l.Node != "e1" || !l.Closed || !l.At.Equal(stop) || !l.Start.Equal(start) || l.Server != "atoll-hub-1" {
				t.Fatalf("loss = %+v", l)
			}
			if got := l.ServerShutdown(); got != tt.shutdown {
				t.Fatalf("server shutdown = %v, want %v (reason %q)", got, tt.shutdown, l.Reason)
			}
		})
	}
	// A connect event: the link opened at its start, and no opening is a
	// server's shutdown.
	open := ev("Leafnode", server.ServerShutdown, "role:edge", "name:e1")
	open.Client.Stop, open.Reason = nil, ""
	l, ok := leafLink(open, false)
	if !ok || l.Closed || !l.At.Equal(start) || !l.Start.Equal(start) || l.ServerShutdown() {
		t.Fatalf("opening = %+v, %v", l, ok)
	}
}

// TestCutAfterRelink: the hub reports a voter's old link closed after the
// voter linked again (a silent cut its server noticed late, a reconnect to
// another server): that close cuts nothing, the voter being linked; the
// close of its newest link, or of one of unknown start, does.
func TestCutAfterRelink(t *testing.T) {
	tr := NewTracker(30 * time.Second)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	oldLink, newLink := now.Add(-time.Hour), now.Add(10*time.Second)
	tr.LinkOpened("a", oldLink)
	tr.LinkOpened("a", newLink)
	tr.LinkOpened("a", oldLink) // late, and older: changes nothing
	closed := newLink.Add(2 * time.Second)
	if !tr.Superseded("a", oldLink, closed) {
		t.Fatal("the old link's close after the new link opened is not superseded")
	}
	if tr.Superseded("a", newLink, closed.Add(time.Minute)) {
		t.Fatal("the newest link's close is superseded")
	}
	if tr.Superseded("a", oldLink, newLink.Add(-time.Second)) {
		t.Fatal("a close before the new link opened is superseded")
	}
	if tr.Superseded("a", time.Time{}, closed) {
		t.Fatal("a close of unknown start is superseded")
	}
	if tr.Superseded("b", oldLink, closed) {
		t.Fatal("a voter never seen linking is superseded")
	}
	// Forgotten with the cuts.
	tr.Prune(newLink.Add(maxCutAge + 2*time.Minute))
	if tr.Superseded("a", oldLink, closed) {
		t.Fatal("a link's opening long past still supersedes a close")
	}
}

// TestLastBallot: the voter's latest recorded ballot is the last one the
// tracker took, not one refused after a cut.
func TestLastBallot(t *testing.T) {
	tr := NewTracker(30 * time.Second)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got := tr.LastBallot("a"); !got.IsZero() {
		t.Fatalf("no ballot yet: %v", got)
	}
	healthy := atollv1.Verdict_VERDICT_HEALTHY
	tr.ObserveBallot(ballot("a", now, 75*time.Second, map[string]atollv1.Verdict{"x": healthy}), now.Add(time.Second))
	if got := tr.LastBallot("a"); !got.Equal(now.Add(time.Second)) {
		t.Fatalf("last ballot stored %v, want %v", got, now.Add(time.Second))
	}
	tr.Cut("a", now.Add(3*time.Second))
	tr.ObserveBallot(ballot("a", now.Add(2*time.Second), 75*time.Second, map[string]atollv1.Verdict{"x": healthy}), now.Add(2*time.Second))
	if got := tr.LastBallot("a"); !got.Equal(now.Add(time.Second)) {
		t.Fatalf("a ballot stored before the cut recorded: last %v", got)
	}
}

// TestLinkDown: a voter is cut from the cloud from the hub's report of its
// link closing until its next ballot.
func TestLinkDown(t *testing.T) {
	tr := NewTracker(30 * time.Second)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	healthy := atollv1.Verdict_VERDICT_HEALTHY
	if tr.LinkDown("a") {
		t.Fatal("a voter never reported is down")
	}
	tr.ObserveBallot(ballot("a", now, 75*time.Second, map[string]atollv1.Verdict{"x": healthy}), now)
	if tr.LinkDown("a") {
		t.Fatal("down before any cut")
	}
	tr.Cut("a", now.Add(time.Second))
	if !tr.LinkDown("a") {
		t.Fatal("up after its link was reported closed")
	}
	tr.ObserveBallot(ballot("a", now.Add(2*time.Second), 75*time.Second, map[string]atollv1.Verdict{"x": healthy}), now.Add(2*time.Second))
	if tr.LinkDown("a") {
		t.Fatal("down after a ballot stored after the cut")
	}
	// A voter cut before its first ballot.
	tr.Cut("b", now)
	if !tr.LinkDown("b") {
		t.Fatal("a voter cut before any ballot is up")
	}
}
