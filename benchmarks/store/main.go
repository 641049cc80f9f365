// Command store runs the store benchmark, as "tensorwire bench store"
// does: go run ./benchmarks/store -h lists its flags. The benchmark is
// internal/bench/store; docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/store"
)

func main() { bench.Main(store.Benchmark) }
