// Package bench is what every tensorwire benchmark program is: a
// Benchmark, a name and a Run function, kept in a package of its own,
// internal/bench/NAME. "tensorwire bench NAME" runs it (cmd/tensorwire
// lists every Benchmark, one line each), and so does "go run
// ./benchmarks/NAME", a main that only calls Main. docs/benchmarks.md says
// how each one measures, how to read it and what its JSON holds.
//
// To add a benchmark: write internal/bench/NAME with a Run and a
// "var Benchmark = bench.Benchmark{...}", add it to the list in
// cmd/tensorwire/bench.go, add benchmarks/NAME/main.go calling Main, and a
// section to docs/benchmarks.md.
package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
)

// A Benchmark is one benchmark program.
type Benchmark struct {
	// Name is its name in "tensorwire bench NAME", "go run
	// ./benchmarks/NAME" and internal/bench/NAME.
	Name string
	// Summary says in one line what it measures, for "tensorwire bench
	// --help".
	Summary string
	// Run runs it as args say (its flags, without the program's name) and
	// returns when it is done, after removing what it made. ctx ending
	// stops it (the program's first SIGINT or SIGTERM ends ctx). Errors
	// that a different command line fixes match ErrUsage; "-h" prints its
	// flags to env.Stdout and returns flag.ErrHelp.
	Run func(ctx context.Context, env Env, args []string) error
}

// Env is what a benchmark runs with.
type Env struct {
	Stdout io.Writer // the results: tables and notes
	Stderr io.Writer // progress and logs
	// Self are the arguments that make the running program (os.Executable)
	// run this benchmark again, before the benchmark's own: ["bench",
	// NAME] in tensorwire, none in benchmarks/NAME. Benchmarks that run
	// parts of themselves in child processes start them with Self followed
	// by their own flags.
	Self []string
}

// ErrUsage matches (errors.Is) the errors of Run that a different command
// line fixes.
var ErrUsage = errors.New("bad usage")

type usageError struct{ msg string }

func (e *usageError) Error() string        { return e.msg }
func (e *usageError) Is(target error) bool { return target == ErrUsage }

// Usagef returns an error with the formatted message that matches
// ErrUsage.
func Usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// Parse parses args with fs, which the benchmark named name defined: "-h"
// prints the usage (PrintUsage) to stdout and returns flag.ErrHelp; a bad
// flag or a positional argument returns a usage error. Flags named in
// hidden are left out of the usage: they are for the benchmark's child
// processes.
func Parse(name string, fs *flag.FlagSet, args []string, stdout io.Writer, hidden ...string) error {
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			PrintUsage(stdout, name, fs, hidden...)
			return err
		}
		return Usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return Usagef("unexpected arguments %q", fs.Args())
	}
	return nil
}

// PrintUsage prints how to run the benchmark named name and its flags, less
// those named in hidden, with their defaults unless empty or false.
func PrintUsage(w io.Writer, name string, fs *flag.FlagSet, hidden ...string) {
	fmt.Fprintf(w, "usage: tensorwire bench %[1]s [flags]\n   or: go run ./benchmarks/%[1]s [flags]\n\n"+
		"docs/benchmarks.md says how it measures and how to read it.\n\nflags:\n", name)
	fs.VisitAll(func(f *flag.Flag) {
		for _, h := range hidden {
			if f.Name == h {
				return
			}
		}
		typ, usage := flag.UnquoteUsage(f)
		if typ != "" {
			typ = " " + typ
		}
		dashes := "--"
		if len(f.Name) == 1 {
			dashes = "-"
		}
		def := ""
		if f.DefValue != "" && f.DefValue != "false" {
			def = fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, "  %s%s%s\n    \t%s%s\n", dashes, f.Name, typ, strings.ReplaceAll(usage, "\n", "\n    \t"), def)
	})
}

// Main runs b as a program, "go run ./benchmarks/NAME": with its flags from
// the command line, results on stdout, progress and logs (slog's default
// logger) on stderr, until the first SIGINT or SIGTERM (benchkit.OnInterrupt;
// a second one ends the program at once). It exits with status 0 on
// success or -h, 2 on bad usage, 130 once interrupted, and 1 on any other
// error.
func Main(b Benchmark) {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)))
	ctx, stop := benchkit.OnInterrupt(context.Background())
	err := b.Run(ctx, Env{Stdout: os.Stdout, Stderr: os.Stderr}, os.Args[1:])
	interrupted := ctx.Err() != nil
	stop()
	os.Exit(exitCode(os.Stderr, b.Name, err, interrupted))
}

// exitCode returns Main's exit status for Run's error, after printing the
// error to w.
func exitCode(w io.Writer, name string, err error, interrupted bool) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, ErrUsage):
		fmt.Fprintf(w, "%s: %v\nrun with -h for its flags\n", name, err)
		return 2
	case interrupted && errors.Is(err, context.Canceled):
		fmt.Fprintf(w, "%s: interrupted\n", name)
		return 130
	default:
		fmt.Fprintf(w, "%s: %v\n", name, err)
		return 1
	}
}
