// Command replay runs the replay-buffer benchmark, as "tensorwire bench
// replay" does: go run ./benchmarks/replay -h lists its flags. The
// benchmark is internal/bench/replay; docs/benchmarks.md says how it
// measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/replay"
)

func main() { bench.Main(replay.Benchmark) }
