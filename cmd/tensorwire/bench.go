package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tensorwire/tensorwire/internal/bench"
	collectivebench "github.com/tensorwire/tensorwire/internal/bench/collective"
	"github.com/tensorwire/tensorwire/internal/bench/fill"
	"github.com/tensorwire/tensorwire/internal/bench/gather"
	"github.com/tensorwire/tensorwire/internal/bench/loader"
	"github.com/tensorwire/tensorwire/internal/bench/replay"
	"github.com/tensorwire/tensorwire/internal/bench/rpc"
	"github.com/tensorwire/tensorwire/internal/bench/serve"
	"github.com/tensorwire/tensorwire/internal/bench/store"
)

// benchmarks are the benchmarks "tensorwire bench NAME" runs, in the order
// "tensorwire bench --help" lists them. Adding one is a line here; see
// internal/bench.
var benchmarks = []bench.Benchmark{
	gather.Benchmark,
	fill.Benchmark,
	rpc.Benchmark,
	replay.Benchmark,
	serve.Benchmark,
	collectivebench.Benchmark,
	store.Benchmark,
	loader.Benchmark,
}

var benchCmd = command{
	name:  "bench",
	usage: "tensorwire bench NAME [flags]",
	help: "run a benchmark: " + benchmarkNames() + "; \"tensorwire bench --help\" says what each measures, " +
		"\"tensorwire bench NAME -h\" lists its flags, docs/benchmarks.md how it measures",
	run: runBench,
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: name a benchmark: %s", errUsage, benchmarkNames())
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stdout, "usage: tensorwire bench NAME [flags]; tensorwire bench NAME -h lists its flags\n\n")
		for _, b := range benchmarks {
			fmt.Fprintf(stdout, "tensorwire bench %s: %s\n", b.Name, b.Summary)
		}
		return flag.ErrHelp
	}
	for _, b := range benchmarks {
		if b.Name != args[0] {
			continue
		}
		err := b.Run(ctx, bench.Env{Stdout: stdout, Stderr: stderr, Self: []string{"bench", b.Name}}, args[1:])
		if err != nil && errors.Is(err, bench.ErrUsage) {
			return fmt.Errorf("%w: %s: %v", errUsage, b.Name, err)
		}
		return err
	}
	return fmt.Errorf("%w: unknown benchmark %q (have: %s)", errUsage, args[0], benchmarkNames())
}

func benchmarkNames() string {
	names := make([]string, len(benchmarks))
	for i, b := range benchmarks {
		names[i] = b.Name
	}
	return strings.Join(names, ", ")
}
