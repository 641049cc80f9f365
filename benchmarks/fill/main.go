// Command fill runs the seed's remote-fill benchmark, as "tensorwire bench
// fill" does: go run ./benchmarks/fill -h lists its flags. The benchmark is
// internal/bench/fill; docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/fill"
)

func main() { bench.Main(fill.Benchmark) }
