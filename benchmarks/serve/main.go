// Command serve runs the serving benchmark, as "tensorwire bench serve"
// does: go run ./benchmarks/serve -h lists its flags. The benchmark is
// internal/bench/serve; docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/serve"
)

func main() { bench.Main(serve.Benchmark) }
