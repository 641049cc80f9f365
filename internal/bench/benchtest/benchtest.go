// Package benchtest is what the tests of the benchmarks (internal/bench/NAME)
// share: the TestMain that lets a benchmark's Run start its child processes
// from the test binary, as it starts them from tensorwire or
// benchmarks/NAME (Main, MainFlag), and a run that writes JSON, read back
// (RunJSON, KeyPaths).
package benchtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
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

// runLimit is how long RunJSON lets a benchmark run: its tests run it
// small and short, for a few seconds; the limit is for a busy machine.
const runLimit = 2 * time.Minute

// Output is what a run of a benchmark in a test wrote.
type Output struct {
	Stdout, Stderr string
	Data           []byte         // the JSON file
	JSON           map[string]any // Data decoded
}

// RunJSON runs run as a benchmark's test does: with args (which tell it
// to write its JSON to jsonFile), an Env.Self of self (nil for none),
// stdout and stderr kept (each safe for concurrent writes), and 2 minutes
// at most. It fails t, with what run wrote, if run fails; then
// it reads jsonFile and decodes it, failing t if it cannot.
func RunJSON(t testing.TB, run Run, self, args []string, jsonFile string) Output {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runLimit)
	defer cancel()
	// Locked: a benchmark's children write to them from goroutines of
	// their own (nodeproc.Spawn copies a child's stdout and stderr to
	// Env.Stderr at once), as they may to the os.Stderr of the program.
	var stdout, stderr proctest.LockedBuffer
	if err := run(ctx, bench.Env{Stdout: &stdout, Stderr: &stderr, Self: self}, args); err != nil {
		t.Fatalf("Run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := Output{Stdout: stdout.String(), Stderr: stderr.String()}
	var err error
	if out.Data, err = os.ReadFile(jsonFile); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Data, &out.JSON); err != nil {
		t.Fatalf("%s: %v", jsonFile, err)
	}
	return out
}

// KeyPaths returns the keys of m and of the objects in it, as dotted
// paths ("config.batch"), sorted. It does not look into arrays.
func KeyPaths(m map[string]any) []string {
	var out []string
	for k, v := range m {
		out = append(out, k)
		if sub, ok := v.(map[string]any); ok {
			for _, p := range KeyPaths(sub) {
				out = append(out, k+"."+p)
			}
		}
	}
	slices.Sort(out)
	return out
}
