// Package replay is a replay buffer for reinforcement learning whose
// transitions live in a memory-mapped TensorDict on a shared filesystem,
// after torchrl's TensorDictReplayBuffer on LazyMemmapStorage and
// DeepMind's Reverb.
//
// A Buffer holds a fixed number of transitions (Config.Capacity) at a
// prefix: the storage (a tensordict memmap that Python reads too), a slot
// table and a metadata file. A writer policy chooses where new transitions
// go (RoundRobin, TopK; ParseWriter), a sampler what a sample returns
// (Uniform, WithoutReplacement, Prioritized, FIFO; ParseSampler), and a
// rate limiter when inserts
// and samples may go ahead (RateLimit, as Reverb's). Everything is safe for
// many writers and samplers at once.
//
// A node serves buffers to other processes and machines (Register,
// Service.Add); they Dial them and make the same calls. When they share the
// node's filesystem no transition crosses the network: writers reserve
// slots, write the rows into their own mapping of the storage and commit
// them; samplers get slots and generations and gather the rows from their
// own mapping. Otherwise the rows travel with the calls.
//
// # Guarantees
//
// A sample never returns a torn row: each slot's generation changes when a
// writer takes it, and a sampler checks the generations of the rows it
// copied after copying them, sampling again those that changed. A slot is
// sampled only once its writer has committed it; a reservation not committed
// within Config.Lease expires and its slots are emptied, so a dead writer
// blocks nobody and leaves nothing half-written to be sampled.
//
// The one gap: a writer sharing the filesystem that is frozen mid-copy for
// longer than an eighth of the lease can land late bytes in a slot handed
// to another writer since, which no generation check sees (docs/replay.md,
// "The lease").
//
// The slot table is a shared mapping, so a buffer process killed at any
// moment reopens (Open) with every transition it had committed and its
// priority; Checkpoint adds durability against a machine crash. A client
// retries calls while its node is unreachable, and a batch it added is
// never in the buffer twice (docs/replay.md, "The buffer node").
//
// A buffer has one owner: Create and Open hold its lock file (LockFile)
// until Close, and a second opener, in any process, gets ErrInUse naming
// the holder's pid and host; the kernel drops the lock when its process
// dies. A buffer whose files are deleted, replaced or truncated under it
// acknowledges nothing more: its calls fail with ErrStorageLost. Create
// checks a Config against the machine's memory and the disk's free space
// before it makes anything.
//
// docs/replay.md in the repository describes the files, the protocol and
// what happens when a process dies.
package replay
