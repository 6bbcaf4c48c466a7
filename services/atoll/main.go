// Command atoll is the operator's tool for an Atoll installation.
//
//	atoll decode [--type T | --subject S]   decode one message payload from stdin to JSON
//	atoll events tail [subject]             print live events, decoded, one line each
//	atoll events catalog                    print the subject catalog as Markdown
//	atoll status [--unit U] [--json]        the cloud's view of every edge unit and node
//
// With the nats CLI: nats sub 'atoll.>' --translate 'atoll decode --subject {{Subject}}'
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/atoll-edge/atoll/events"
)

const usage = `usage: atoll <command> [flags]

commands:
  decode        decode one message payload read from stdin and print it as JSON
  events tail   print live events on a subject (default atoll.>), one line each
  events catalog  print the subject catalog and the hub streams as Markdown
  status        print each edge unit's disruption state and its nodes' health

Run 'atoll <command> -h' for a command's flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdin, os.Stdout); err != nil {
		var u usageError
		if errors.As(err, &u) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		fmt.Fprintln(os.Stderr, "atoll:", err)
		os.Exit(1)
	}
}

type usageError struct{}

func (usageError) Error() string { return "usage" }

func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return usageError{}
	}
	switch args[0] {
	case "decode":
		return decode(args[1:], stdin, stdout)
	case "events":
		if len(args) < 2 {
			return usageError{}
		}
		switch args[1] {
		case "tail":
			return tail(ctx, args[2:], stdout)
		case "catalog":
			if len(args) > 2 {
				return fmt.Errorf("events catalog: unexpected argument %q", args[2])
			}
			_, err := fmt.Fprint(stdout, events.CatalogMarkdown())
			return err
		default:
			return usageError{}
		}
	case "status":
		return statusCmd(ctx, args[1:], stdout)
	default:
		return usageError{}
	}
}
