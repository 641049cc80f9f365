// Command collective runs the collectives benchmark, as "tensorwire bench
// collective" does: go run ./benchmarks/collective -h lists its flags. The
// benchmark is internal/bench/collective; docs/benchmarks.md says how it
// measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/collective"
)

func main() { bench.Main(collective.Benchmark) }
