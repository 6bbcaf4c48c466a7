// Command atoll is the operator's tool for an Atoll installation.
//
//	atoll decode [--type T | --subject S]          decode one message payload from stdin to JSON
//	atoll events tail [subject]                    print live events, decoded, one line each
//	atoll events catalog                           print the subject catalog as Markdown
//	atoll nats context [--name N]                  write a nats CLI context for the hub
//	atoll status [--unit U] [-o wide|json|yaml]    is my site safe? then every edge unit (wide: node)
//	atoll node enroll [--ttl D] NODE               a one-time bootstrap token for NODE
//	atoll node revoke NODE                         cut NODE off the hub for good
//	atoll grid status [-n NS] [-o json|yaml] NAME  a grid's units and rollout (kubeconfig)
//	atoll grid resume [-n NS] NAME                 continue a grid's stopped rollout (kubeconfig)
//
// With the nats CLI: atoll nats context, then
// nats --context atoll sub 'atoll.>' --translate 'atoll decode --subject {{Subject}}'
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/atoll-edge/atoll/events"
	"github.com/atoll-edge/atoll/internal/cliflags"
)

const usage = `usage: atoll <command> [flags]

commands:
  decode          decode one message payload read from stdin and print it as JSON
  events tail     print live events on a subject (default atoll.>), one line each
  events catalog  print the subject catalog and the hub streams as Markdown
  nats context    write a nats CLI context (~/.config/nats/context/atoll.json) for the hub
  status          is my site safe? a one-line verdict, then each edge unit's state (-o wide: each node's)
  node enroll     issue a one-time bootstrap token for a node (atoll-edge --bootstrap-token-file)
  node revoke     revoke a node's credentials: its hub link closes and it cannot reconnect
  grid status     print a DeploymentGrid's or StatefulSetGrid's units and rollout position
  grid resume     continue a grid's rollout stopped at a unit's progress deadline

Run 'atoll <command> -h' for a command's flags. The commands that talk to the
hub read $ATOLL_NATS_URL and $ATOLL_NATS_CREDS (an operator's credentials file);
the grid commands read the kubeconfig ($KUBECONFIG or --kubeconfig).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cliflags.Main("atoll", func() error { return run(ctx, os.Args[1:], os.Stdin, os.Stdout) })
}

// help reports whether arg asks for help.
func help(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" || arg == "help" }

// run runs the command line args. -h anywhere prints that command's usage on
// stdout and returns flag.ErrHelp; a wrong command line is a
// cliflags.UsageError.
func run(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return cliflags.UsageError{Err: fmt.Errorf("no command given (decode, events tail, events catalog, nats context, node enroll, node revoke, status, grid status, grid resume)")}
	}
	switch cmd := args[0]; {
	case help(cmd):
		fmt.Fprint(stdout, usage)
		return flag.ErrHelp
	case cmd == "decode":
		return decode(args[1:], stdin, stdout)
	case cmd == "events":
		return group(ctx, "events", args[1:], stdout, map[string]func() error{
			"tail":    func() error { return tail(ctx, args[2:], stdout) },
			"catalog": func() error { return catalog(args[2:], stdout) },
		})
	case cmd == "nats":
		return group(ctx, "nats", args[1:], stdout, map[string]func() error{
			"context": func() error { return natsContext(args[2:], stdout) },
		})
	case cmd == "node":
		return group(ctx, "node", args[1:], stdout, map[string]func() error{
			"enroll": func() error { return nodeEnroll(ctx, args[2:], stdout) },
			"revoke": func() error { return nodeRevoke(ctx, args[2:], stdout) },
		})
	case cmd == "status":
		return statusCmd(ctx, args[1:], stdout)
	case cmd == "grid":
		return group(ctx, "grid", args[1:], stdout, map[string]func() error{
			"status": func() error { return gridStatus(ctx, args[2:], stdout) },
			"resume": func() error { return gridResume(ctx, args[2:], stdout) },
		})
	default:
		return cliflags.Usagef("unknown command %q", cmd)
	}
}

// group runs the subcommand args[0] of the command group name.
func group(_ context.Context, name string, args []string, stdout io.Writer, subs map[string]func() error) error {
	names := make([]string, 0, len(subs))
	for _, n := range []string{"tail", "catalog", "context", "enroll", "revoke", "status", "resume"} {
		if _, ok := subs[n]; ok {
			names = append(names, n)
		}
	}
	switch {
	case len(args) == 0:
		return cliflags.UsageError{Err: fmt.Errorf("%s: give a subcommand: %v", name, names), Cmd: "atoll " + name}
	case help(args[0]):
		fmt.Fprintf(stdout, "usage: atoll %s <subcommand> [flags]\n\nsubcommands: %v\n\nRun 'atoll %s <subcommand> -h' for its flags.\n", name, names, name)
		return flag.ErrHelp
	}
	sub, ok := subs[args[0]]
	if !ok {
		return cliflags.UsageError{Err: fmt.Errorf("%s: unknown subcommand %q (want one of %v)", name, args[0], names), Cmd: "atoll " + name}
	}
	return sub()
}

// catalog prints the subject catalog.
func catalog(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("atoll events catalog", flag.ContinueOnError)
	if err := parseFlags(fs, args, stdout, "atoll events catalog   (no flags)"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cliflags.UsageError{Err: fmt.Errorf("events catalog: unexpected argument %q", fs.Arg(0)), Cmd: fs.Name()}
	}
	_, err := fmt.Fprint(stdout, events.CatalogMarkdown())
	return err
}

// parseFlags parses a command's flags; -h prints its usage on stdout and
// returns flag.ErrHelp, a bad flag is a cliflags.UsageError.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer, synopsis string) error {
	err := cliflags.Parse(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		cliflags.PrintUsage(stdout, fs, synopsis)
	}
	return err
}
