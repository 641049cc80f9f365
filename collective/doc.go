// Package collective runs MPI-style collectives between processes on
// tensors (tensordict Tensors, and gorgonia Dense values through
// tensordict.FromDense and Tensor.Dense, both without copying), with the
// adjoint of every operation for backward passes across ranks, after
// mpi4torch.
//
// A communicator (Comm) is Size ranks, one per process (or per Comm in one
// process), formed by Join through rank 0's address or a static list of
// addresses. Its collectives are Allreduce, Bcast, Reduce, Gather,
// Allgather, Scatter, Alltoall, ReduceScatter and Barrier, with the
// reductions Sum, Prod, Min, Max and the logical and bitwise ones (Op);
// Gather, Allgather and Alltoall take tensors whose sizes along the
// gathered axis differ between ranks (MPI's Gatherv). Point-to-point calls
// are Send, Recv, Isend, Irecv and Request.Wait.
//
// # Transports
//
// Ranks on one host exchange through shared mappings: each rank publishes
// its input into a file of its own under Config.ShmDir (/dev/shm), every
// rank maps the others' files, and each reads what it needs from them
// directly. An Allreduce or ReduceScatter above 64 KiB a rank, and every
// Reduce, goes in chunks through two slots of those files, each rank's
// share of a chunk 256 KiB (a ReduceScatter's, its block's if smaller):
// each rank copies a chunk in, reduces its share of it from every rank's
// slot, and copies the reduced shares out (Allreduce; Reduce: the root), while the
// next chunk is copied in, so what the ranks read of each other is still
// in the caches. No byte crosses a socket; the ranks synchronise through
// words of their own in the mapping: a phase per collective, and a
// progress word per rank that moves once per chunk step (a short spin,
// then a futex). Ranks on several hosts
// exchange over their rpc connections (package rpc): recursive doubling
// for small Allreduce; for large Allreduce with up to 8 ranks, each rank
// reducing its block of every rank's tensor and sending it to every other
// (two steps), and pipelined rings with more; pipelined rings for
// ReduceScatter and Allgather, a binomial tree for Bcast, direct sends for
// the rest. Where some of several hosts hold two or more ranks, the
// communicator is hierarchical (Transport Hier, Comm.Topology): an
// Allreduce, a Bcast, an Allgather, a Reduce and a ReduceScatter go
// through each host's mappings and between hosts over TCP, the other
// collectives over TCP between every pair of ranks.
// Point-to-point calls between ranks that share a folder (shared
// mappings, host-mates in a hierarchy) go through it: the bytes by
// reference to a file of the sender's, the note and its answer through
// the receiver's inbox (a ring per sender and a futex word); between
// other ranks, over rpc.
//
// # Adjoints
//
// Every operation has its adjoint as a function of the upstream gradient
// (AllreduceAdjoint, BcastAdjoint, ...), under the convention that the loss
// is the sum of the ranks' own losses; only Sum reductions have one
// (ErrNoAdjoint otherwise, never a silent wrong gradient). A Tape records
// the communication of a forward pass and the local computations between
// (Tape.Func, with adjoints written by the caller) and replays the adjoints
// in reverse, the same order on every rank, so the backward communication
// cannot deadlock; Tape.JoinDummies is there for code ported from
// mpi4torch.
//
// # Guarantees
//
// Before any data moves, every rank checks every rank's description of
// the call: mismatched collectives, dtypes or shapes (ErrMismatch), a root
// out of range, counts that do not sum to the axis, an axis the tensor does
// not have (ErrArgument), a shared folder too full for a rank's input
// (ErrNoSpace) fail the call on every rank with the same error, never a
// hang, and the communicator stays usable. Reductions combine the
// ranks' values in rank order where the algorithm allows (always through
// shared mappings), and every rank gets the same bits.
//
// A rank that dies fails every pending operation on the others with
// ErrPeerLost (an rpc Unavailable) as soon as its sockets close (at once
// for a killed process; after Config.KeepAlive times five for a host that
// falls silent), and a rank whose context ends part-way, or that fails for
// a reason of its own (a fault on a tensor that is a mapping whose file
// was truncated, a malformed message), tells the others at once
// (ErrAborted naming it), on every transport. After such a failure the communicator is broken: later
// calls fail with ErrBroken; Close it and Join again (a new communicator
// forms on the same rendezvous). An error says once which rank failed and
// why.
//
// Join honours its context's deadline throughout, refuses a Size above
// MaxSize (ErrConfig), and fails at once on every rank with
// ErrUnauthenticated when a rank's token is refused: an authentication
// failure is never retried.
//
// docs/collective.md in the repository describes the protocol, the
// algorithms and what happens when a rank dies.
package collective
