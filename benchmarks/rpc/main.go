// Command rpc runs the RPC benchmark, as "tensorwire bench rpc" does: go run
// ./benchmarks/rpc -h lists its flags. The benchmark is internal/bench/rpc;
// docs/benchmarks.md says how it measures.
package main

import (
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/rpc"
)

func main() { bench.Main(rpc.Benchmark) }
