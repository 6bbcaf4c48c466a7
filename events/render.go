package events

import (
	"fmt"
	"strings"
	"time"
)

// Markers of the generated catalog in docs/reference/subjects.md.
const (
	CatalogBegin = "<!-- catalog:begin (generated: go tool task docs:gen) -->"
	CatalogEnd   = "<!-- catalog:end -->"
)

// CatalogMarkdown renders the subject catalog and the hub streams as the
// Markdown tables of docs/reference/subjects.md.
func CatalogMarkdown() string {
	var b strings.Builder
	b.WriteString("| subject | message | transport | Nats-Msg-Id | producer → consumer |\n")
	b.WriteString("|---|---|---|---|---|\n")
	for _, f := range catalog {
		msg := "`" + shortType(TypeName(f.Message)) + "`"
		if f.Reply != nil {
			msg += " → `" + shortType(TypeName(f.Reply)) + "`"
		}
		var transport string
		switch f.Transport {
		case TransportStream:
			transport = "stream `" + f.Stream + "`"
		case TransportRequest:
			transport = fmt.Sprintf("request/reply: micro service `%s`, endpoint `%s`", f.Service, f.Endpoint)
		default:
			transport = "core NATS"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s → %s |\n", pattern(f), msg, transport, f.MsgID, f.Producer, f.Consumer)
	}
	b.WriteString("\n| stream | subjects | retention | holds |\n")
	b.WriteString("|---|---|---|---|\n")
	for _, d := range streamDefs {
		subjects := StreamSubjects(d.Name)
		for i, s := range subjects {
			subjects[i] = "`" + s + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.Name, strings.Join(subjects, ", "), retention(d), d.Description)
	}
	return b.String()
}

// pattern renders f's pattern, with the allowed values of restricted tokens.
func pattern(f *Family) string {
	out := make([]string, len(f.tokens))
	for i, t := range f.tokens {
		switch {
		case t.literal != "":
			out[i] = t.literal
		case f.Values[t.name] != nil:
			out[i] = "<" + strings.Join(f.Values[t.name], `\|`) + ">"
		default:
			out[i] = "<" + t.name + ">"
		}
	}
	return strings.Join(out, ".")
}

func shortType(full string) string { return full[strings.LastIndex(full, ".")+1:] }

func retention(d StreamDef) string {
	parts := []string{"last per subject"}
	if d.MaxMsgsPerSubject > 1 {
		parts[0] = fmt.Sprintf("last %d per subject", d.MaxMsgsPerSubject)
	}
	if d.MaxAge > 0 {
		parts = append(parts, "at most "+days(d.MaxAge))
	}
	if d.AllowRollup {
		parts = append(parts, "rollup allowed")
	}
	if d.RePublish != nil {
		parts = append(parts, "republished on `"+d.RePublish.Destination+"`")
	}
	return strings.Join(parts, ", ")
}

func days(d time.Duration) string {
	switch {
	case d%(24*time.Hour) == 0:
		return fmt.Sprintf("%d d", d/(24*time.Hour))
	case d%time.Hour == 0:
		return fmt.Sprintf("%d h", d/time.Hour)
	default:
		return d.String()
	}
}
