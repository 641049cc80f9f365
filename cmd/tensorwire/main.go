// Command tensorwire works with memory-mapped TensorDict datasets stored in
// PyTorch tensordict's on-disk format, and serves them to other nodes.
//
// Usage:
//
//	tensorwire inspect [--json] [--stats] PREFIX
//	tensorwire import idx [--force] --images F --labels F [--images F --labels F ...] PREFIX
//	tensorwire import npy [--force] key=FILE.npy ... PREFIX
//	tensorwire mlp [--sizes N,N,...] [--seed S] [--force] PREFIX   (random MLP weights in state_dict layout)
//	tensorwire node --listen ADDR --root DIR [--token-file F] [--tls-cert F --tls-key F] [--buffer ...] [--store ...] [--loader ...] [--serve ...] [--metrics ADDR]
//	tensorwire stats [--json] [--all] ADDR     (a node's --metrics, as a table)
//	tensorwire bench NAME [flags]          (NAME: gather, fill, rpc, replay, serve, collective, store, loader; "tensorwire bench --help")
//
// Run "tensorwire help" for details, and "tensorwire CMD -h" (or
// "tensorwire help CMD") for a command's flags with their defaults. Progress and logs go to stderr, results
// to stdout. The exit status is 0 on success, 1 on failure, 2 on bad usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
)

// command is one subcommand: it parses its own arguments.
type command struct {
	name, usage, help string
	run               func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{inspectCmd, importCmd, mlpCmd, nodeCmd, statsCmd, benchCmd, collectiveCmd}

// errUsage marks an error whose fix is a different command line.
var errUsage = errors.New("usage")

func main() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	// The first SIGINT or SIGTERM ends ctx; the next gets the default action
	// and ends the program at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run executes one command line and returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) == 2 && args[0] == "help" { // "help CMD" is "CMD -h"
			args = []string{args[1], "-h"}
		} else {
			printUsage(stdout)
			if len(args) == 0 {
				return 2
			}
			return 0
		}
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		var help *helpRequest
		switch {
		case err == nil:
			return 0
		case errors.As(err, &help):
			printCommandHelp(stdout, c, help.fs)
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage) && len(args) > 1 && isHelp(args[1]):
			// "import -h": help asked before the command knows its flags
			printCommandHelp(stdout, c, nil)
			return 0
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "tensorwire %s: %v\nusage: %s\n", c.name, err, c.usage)
			return 2
		default:
			fmt.Fprintf(stderr, "tensorwire %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "tensorwire: unknown command %q\n", args[0])
	printUsage(stderr)
	return 2
}

// helpRequest is the error a command returns for -h or --help: run prints
// the command's usage, its help and the flags of fs (nil: none) to stdout,
// and exits 0. It matches flag.ErrHelp.
type helpRequest struct{ fs *flag.FlagSet }

func (*helpRequest) Error() string { return "help requested" }
func (*helpRequest) Unwrap() error { return flag.ErrHelp }

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// printCommandHelp prints c's usage line, its help wrapped to 80 columns
// and, when fs is not nil, each flag of fs with its type, its description
// and its default (when not the type's zero value).
func printCommandHelp(w io.Writer, c command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: %s\n\n", c.usage)
	fmt.Fprintln(w, wrap(c.help, 80))
	if fs == nil {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if typ != "" {
			fmt.Fprintf(w, " %s", typ)
		}
		fmt.Fprintf(w, "\n      %s", usage)
		if !isZeroValue(f) {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}

// isZeroValue reports whether f's default is its type's zero value (as
// the flag package decides for PrintDefaults), which help does not print.
func isZeroValue(f *flag.Flag) bool {
	typ := reflect.TypeOf(f.Value)
	var z reflect.Value
	if typ.Kind() == reflect.Pointer {
		z = reflect.New(typ.Elem())
	} else {
		z = reflect.Zero(typ)
	}
	v, ok := z.Interface().(flag.Value)
	return ok && f.DefValue == v.String()
}

// wrap breaks s into lines of at most width columns between words.
func wrap(s string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(s) {
		switch {
		case n == 0:
		case n+1+len(word) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "tensorwire: memory-mapped tensor datasets in PyTorch tensordict's format")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n      %s\n", c.usage, c.help)
	}
}

// parse parses flags that may come before, between or after positional
// arguments ("inspect PREFIX --json" as well as "inspect --json PREFIX"),
// and returns the positional ones. For -h or --help it returns a
// *helpRequest, which run answers with the command's usage and flags.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &helpRequest{fs}
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}
