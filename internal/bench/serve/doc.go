// Package serve is the serving benchmark, "tensorwire bench serve": a node
// serving a model through package serve, and client processes, each in a
// closed loop of single-row predictions, against the same clients with
// batching off (max batch 1) and the model's own forward throughput at the
// max batch in-process (the limit). Two models: the MLP of serve/mlp
// (64 -> 256 -> 16, ReLU, float32) and a calibrated fake that sleeps
// 1 ms + 5 us per row, to isolate batching and transport. A last run
// measures what loading 50 MB of parameters every half second costs the
// clients' p99.
//
//	tensorwire bench serve [--clients 1,8,32,128] [--model mlp,fake] [--max-batch 16] [--duration 5s] [--json FILE] [--profile PREFIX]
//
// --profile writes a CPU profile of each run's node and first client
// (PREFIX-MODEL-CLIENTS-MAXBATCH-{node,client}.pprof), for go tool pprof,
// and for a Python model its first replica's cProfile report
// (PREFIX-MODEL-CLIENTS-MAXBATCH-replica.txt: wall time by function, so
// waits on the socket and on the device show); the weight-update run is
// not profiled.
//
// docs/benchmarks.md, "Serving", says how it measures, how to read it and
// what its JSON holds (Result).
package serve
