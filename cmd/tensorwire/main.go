// Command tensorwire works with memory-mapped TensorDict datasets stored in
// PyTorch tensordict's on-disk format, and serves them to other nodes.
//
// Usage:
//
//	tensorwire inspect [--json] [--stats] PREFIX
//	tensorwire import idx [--force] --images F --labels F [--images F --labels F ...] PREFIX
//	tensorwire import npy [--force] key=FILE.npy ... PREFIX
//	tensorwire node --listen ADDR --root DIR [--token-file F] [--tls-cert F --tls-key F]
//	tensorwire bench NAME [flags]          (NAME: gather, fill, rpc, replay; "tensorwire bench --help")
//
// Run "tensorwire help" for details. Progress and logs go to stderr, results
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
	"syscall"
)

// command is one subcommand: it parses its own arguments.
type command struct {
	name, usage, help string
	run               func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var commands = []command{inspectCmd, importCmd, nodeCmd, benchCmd}

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
		printUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
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

func printUsage(w io.Writer) {
	fmt.Fprintln(w, "tensorwire: memory-mapped tensor datasets in PyTorch tensordict's format")
	fmt.Fprintln(w)
	for _, c := range commands {
		fmt.Fprintf(w, "  %s\n      %s\n", c.usage, c.help)
	}
}

// parse parses flags that may come before, between or after positional
// arguments ("inspect PREFIX --json" as well as "inspect --json PREFIX"),
// and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
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
