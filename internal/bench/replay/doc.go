// Package replay is the distributed replay-buffer benchmark, "tensorwire
// bench replay": a buffer node, writers and a trainer, each a process of
// its own, work on one replay buffer through replay.Client, first with the
// rows in the shared storage (mode "ref") and then with the rows
// travelling with the calls (mode "bytes"). It reports inserts and samples
// per second, Extend and SampleInto latencies, the node's heap and the
// torn rows the trainer was given, against the memcpy gather limit and the
// seed stack. With --trainer python or --writers-lang python those roles
// run the Python client (python/, over numpy) instead, each mode first
// running all in Go for comparison.
//
//	tensorwire bench replay [--duration 20s] [--writers 2] [--modes ref,bytes] [--json FILE] [-v]
//	tensorwire bench replay --trainer python [--writers-lang python] ...   # Python roles, beside an all-Go run
//	tensorwire bench replay --role buffer|writer|trainer ...   # one process, on its own host
//	tensorwire bench replay --sampler slice [--python PY] [--duration 10s] [--json FILE]   # slices of episodes against torchrl's SliceSampler
//
// docs/benchmarks.md, "Replay buffer", says how it measures, how to read it
// and what its JSON holds (Result).
package replay
