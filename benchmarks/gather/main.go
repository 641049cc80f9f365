// Command gather runs the gather benchmark, as "tensorwire bench gather"
// does: go run ./benchmarks/gather -h lists its flags. The benchmark is
// internal/bench/gather; docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/gather"
)

func main() { bench.Main(gather.Benchmark) }
