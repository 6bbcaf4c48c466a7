package cliflags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// Exit codes of Atoll's commands.
const (
	// ExitRuntime: the command line was fine but the command failed.
	ExitRuntime = 1
	// ExitUsage: the command line was wrong (unknown flag, bad value,
	// missing setting).
	ExitUsage = 2
)

// UsageError is a command line the command cannot run with. Its message is
// one line naming the flag, the value and what is expected.
type UsageError struct {
	Err error
	// Cmd is the command whose -h the hint points to ("atoll status");
	// empty: the program.
	Cmd string
}

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// ExitCode ends a command that has printed what it means with Code and
// no further message (`atoll status --exit-code`: 3 degraded, 4 at risk).
type ExitCode struct{ Code int }

func (e ExitCode) Error() string { return fmt.Sprintf("exit code %d", e.Code) }

// Usage marks err as a usage error (exit code 2); nil stays nil.
func Usage(err error) error {
	if err == nil {
		return nil
	}
	return UsageError{Err: err}
}

// Usagef is a usage error with a formatted message.
func Usagef(format string, a ...any) error { return UsageError{Err: fmt.Errorf(format, a...)} }

// Parse parses args into fs without printing anything: -h or --help
// returns flag.ErrHelp (print the usage with PrintUsage), a bad flag a
// UsageError with flag's own one-line message.
func Parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		return flag.ErrHelp
	default:
		return UsageError{Err: err, Cmd: fs.Name()}
	}
}

// PrintUsage writes fs's flags with their defaults to w, under a
// "usage: <synopsis>" line.
func PrintUsage(w io.Writer, fs *flag.FlagSet, synopsis string) {
	fmt.Fprintf(w, "usage: %s\n", synopsis)
	n := 0
	fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprint(w, "\nflags:\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// Exit reports err for the command prog and returns the process exit code:
// 0 for nil or flag.ErrHelp, an ExitCode's own code (nothing printed), 2
// with a hint to run prog -h for a usage error, 1 for anything else. Each error is one line on w:
// "prog: what is wrong".
func Exit(w io.Writer, prog string, err error) int {
	var u UsageError
	var code ExitCode
	switch {
	case err == nil || errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &code):
		return code.Code
	case errors.As(err, &u):
		cmd := u.Cmd
		if cmd == "" {
			cmd = prog
		}
		fmt.Fprintf(w, "%s: %v\nRun '%s -h' for usage.\n", prog, err, cmd)
		return ExitUsage
	default:
		fmt.Fprintf(w, "%s: %v\n", prog, err)
		return ExitRuntime
	}
}

// Main runs a command's run function and exits the process with the code
// Exit gives its error.
func Main(prog string, run func() error) {
	os.Exit(Exit(os.Stderr, prog, run()))
}
