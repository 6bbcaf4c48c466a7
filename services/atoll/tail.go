package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/cliflags"
)

func tail(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll events tail", flag.ContinueOnError)
	var hf hubFlags
	hf.register(fs)
	count := fs.Int("count", 0, "exit after this many events (0: run until interrupted)")
	if err := parseFlags(fs, args, stdout, "atoll events tail [flags] [subject]   (default subject atoll.>, without the republished views)"); err != nil {
		return err
	}
	subject := events.AllSubjects
	// By default a view is shown once, as stored, not again as the hub
	// republishes it (atoll.viewpub.>); ask for that subject to see it.
	republished := false
	switch fs.NArg() {
	case 0:
	case 1:
		subject, republished = fs.Arg(0), true
	default:
		return cliflags.Usagef("events tail: one subject at most, got %q", fs.Args())
	}
	nc, err := hf.connect("atoll events tail", nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()

	msgs := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(subject, msgs)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	for n := 0; *count == 0 || n < *count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			if !republished && events.SubjectMatches(events.ViewRepublishSubjects, m.Subject) {
				n--
				continue
			}
			fmt.Fprintln(stdout, line(m, time.Now()))
		}
	}
	return nil
}

// line renders one event: time, subject, type and the payload as compact
// JSON, or the reason it could not be decoded.
func line(m *nats.Msg, at time.Time) string {
	typ := m.Header.Get(events.HeaderType)
	if typ == "" {
		typ, _ = events.TypeForSubject(m.Subject)
	}
	body := ""
	if pm, err := events.Decode(typ, m.Data); err != nil {
		body = fmt.Sprintf("<%v; %d bytes>", err, len(m.Data))
	} else if b, err := toJSON(pm, false); err != nil {
		body = fmt.Sprintf("<%v>", err)
	} else {
		body = string(b)
	}
	if typ == "" {
		typ = "?"
	}
	return fmt.Sprintf("%s %s %s %s", at.Format("15:04:05.000"), m.Subject, typ, body)
}
