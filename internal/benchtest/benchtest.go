// Package benchtest is what the tests of the benchmarks (internal/bench/NAME)
// share: the TestMain that lets a benchmark's Run start its child processes
// from the test binary, as it starts them from tensorwire or
// benchmarks/NAME.
package benchtest

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// Run is a benchmark's Run (bench.Benchmark.Run).
type Run func(ctx context.Context, env bench.Env, args []string) error

// Main is the TestMain of a benchmark whose tests give Run an Env.Self of
// self (["bench", NAME], as tensorwire does): Run starts a child as its
// own program (the test binary here) with self and the child's flags.
// When the test binary's arguments begin with self, Main runs run with
// the arguments after self, Env.Self self, and the process's stdout and
// stderr, and exits: status 0 if run returned nil, else 1 with the error
// on stderr. Otherwise it runs the tests and exits with their status.
// self must not be empty (see MainFlag): with none, Main says so on
// stderr and exits with status 2.
func Main(m *testing.M, run Run, self ...string) {
	if len(self) == 0 {
		fmt.Fprintln(os.Stderr, "benchtest.Main: no self; a benchmark run with an empty Env.Self wants MainFlag")
		os.Exit(2)
	}
	if len(os.Args) > len(self) && slices.Equal(os.Args[1:1+len(self)], self) {
		child(run, self, os.Args[1+len(self):])
	}
	os.Exit(m.Run())
}

// MainFlag is the TestMain of a benchmark whose tests give Run an empty
// Env.Self (as benchmarks/NAME does): Run starts a child as its own
// program with the child's flags alone, the first of them flag (its
// hidden "--node-b" or "--serve"), which tells Run what to be. When the
// test binary's first argument is flag, MainFlag runs run with every
// argument, flag included, and exits as Main does; otherwise it runs the
// tests.
func MainFlag(m *testing.M, run Run, flag string) {
	if len(os.Args) > 1 && os.Args[1] == flag {
		child(run, nil, os.Args[1:])
	}
	os.Exit(m.Run())
}

// child runs run as a benchmark's child process and exits.
func child(run Run, self, args []string) {
	if err := run(context.Background(), bench.Env{Stdout: os.Stdout, Stderr: os.Stderr, Self: self}, args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}
