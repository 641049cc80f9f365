// Command loader runs the loader benchmark, as "tensorwire bench loader"
// does: go run ./benchmarks/loader -h lists its flags. The benchmark is
// internal/bench/loader; docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/loader"
)

func main() { bench.Main(loader.Benchmark) }
