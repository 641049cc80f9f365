package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	replaybench "github.com/tensorwire/tensorwire/benchmarks/replay"
)

var benchCmd = command{
	name:  "bench",
	usage: "tensorwire bench replay [--duration 20s] [--writers 2] [--capacity 50000] [--modes ref,bytes] [--json F] [flags]",
	help: "run a benchmark. replay: a replay-buffer node, writers and a trainer, each a process, in ref mode " +
		"(rows in the shared storage) and bytes mode (rows with the calls): inserts/s, samples/s, latencies, the " +
		"node's heap, torn rows, against the memcpy limit and the seed stack; \"tensorwire bench replay -h\" lists " +
		"its flags, --role runs one of its processes on its own host",
	run: runBench,
}

// benchmark is one subcommand of bench.
type benchmark struct {
	name, help string
	run        func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	usageErr   error // what run's usage errors match
}

var benchmarks = []benchmark{
	{"replay", "the distributed replay buffer", replaybench.Run, replaybench.ErrUsage},
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: name a benchmark: %s", errUsage, benchmarkNames())
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		for _, b := range benchmarks {
			fmt.Fprintf(stdout, "tensorwire bench %s: %s\n", b.name, b.help)
		}
		return flag.ErrHelp
	}
	for _, b := range benchmarks {
		if b.name != args[0] {
			continue
		}
		err := b.run(ctx, args[1:], stdout, stderr)
		if err != nil && errors.Is(err, b.usageErr) {
			return fmt.Errorf("%w: %v", errUsage, err)
		}
		return err
	}
	return fmt.Errorf("%w: unknown benchmark %q (have: %s)", errUsage, args[0], benchmarkNames())
}

func benchmarkNames() string {
	names := make([]string, len(benchmarks))
	for i, b := range benchmarks {
		names[i] = b.name
	}
	return strings.Join(names, ", ")
}
