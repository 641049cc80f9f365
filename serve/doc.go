// Package serve batches many callers' predictions onto model replicas:
// torch_spread's dynamic batching, in Go.
package serve
