// Package serve batches many callers' predictions onto model replicas:
// torch_spread's dynamic batching for reinforcement learning, where many
// workers each hold one environment state and need the policy's
// prediction for it, in Go.
//
// A Manager runs Config.Replicas models, each built by Config.New and run
// by a goroutine of its own, and batches the requests of its callers
// (Predict, PredictInto) onto them: requests join the open batch while the
// replicas run the batches before it, and a replica takes the open batch
// when it is free (Greedy, torch_spread's policy), or when it is full or
// has waited MaxDelay. A model is anything with Forward(ctx, batch) over
// the rows of Config.Input, returning rows of Config.Output; serve/mlp is
// the example's, an MLP whose weights PyTorch writes.
//
// A node serves managers to other processes and machines (Register,
// Service.Add), which Dial them by name. A client that shares the node's
// filesystem has slots in files under the root that the node maps, so no
// row crosses the network: on Linux a request is an entry in a ring the
// client shares with the node and a futex wake-up each way (bell.go), and
// elsewhere a call carrying only (client, rows). Other clients send their
// rows with the calls.
//
// # Guarantees
//
// A request is never split: its rows run in one batch, and its outputs
// are that batch's. Each batch runs with one parameter version, and every
// response says which: replicas switch to new parameters (Load,
// LoadVersion, LoadParam, Follow) only between batches, through a spare
// model loaded off the serving path, and Load returns once every model
// has the new version. Bad input is refused before anything is queued
// (ErrSchema, saying which key, dtype or shape is wrong), a full queue
// refuses at once (ErrQueueFull), and memory never grows with the load
// (Config.MaxQueue). Models that need parameters (ParamsNeeder, as
// serve/mlp's MLP) predict nothing before the first Load: ErrNoParams, not
// zero weights. A Forward that fails, panics or faults on memory (a
// mapping truncated under it, on the replica's goroutine) fails its
// batch's requests with ErrForward and the replica gets a new model; the
// others serve on. serve/mlp copies its weights at Load under memmap's
// fault guard, so a truncated weights file is an error at Load, never a
// SIGBUS in a batch.
//
// A client that dies is forgotten after Config.Lease: its registration
// ends and the node removes its folder (a live client holds a lock on it);
// the batch it was in completes for the others. A client rides out its
// node restarting: calls are retried while the node is unreachable, and
// the client registers again with the node that comes back; predictions
// hold no state, so a retried one is always safe. A node writes no rows of
// a registration it dropped, so a request by bell sent again is answered
// once, never later over rows the caller reused. A node reads clients'
// shared files under a fault guard, so a client that truncates them ends
// its own registration, never the node.
//
// docs/serve.md in the repository describes the batching, the weights,
// the protocol and what happens when a process dies.
package serve
