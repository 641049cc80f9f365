// Package loader shares one data loader's batches among several training
// processes, as tensorsocket does for PyTorch: a Producer reads a dataset,
// shuffles it every epoch, transforms each sample once, and writes the
// batches into a ring of slots in a shared mapping; Consumers iterate them
// as they would their own loader, each with its own batch size.
//
// A node serves producers (Register, Service.Add; "tensorwire node
// --loader"); a training job joins one with Dial and iterates an epoch per
// call of Batches:
//
//	c, err := loader.Dial(ctx, addr, "train", loader.Options{Batch: 64, Root: root})
//	for epoch := 0; epoch < 10; epoch++ {
//		for batch, err := range c.Batches(ctx) { ... }
//	}
//
// The dataset is a memory-mapped TensorDict of batch size [N] (any prefix
// "tensorwire import" or tensordict's memmap writes). A Transform (Augment:
// random crop with padding, horizontal flip, normalize to float32) runs in
// the producer, once per sample for every consumer. Local runs the same
// dataset, order and transform inside one process, with the same API: what
// every job would run on its own.
//
// # Guarantees
//
// Every consumer gets every sample of an epoch exactly once, in the
// producer's order, cut into batches of its own size; an epoch's last
// batch is short unless Options.DropLast. Each call of Batches ends with
// its epoch, and Len is the number of batches it yields. A data-parallel
// rank (Options.Rank, Options.WorldSize) gets its DistributedSampler
// share of each epoch instead. A restarted job resumes an epoch where its
// saved State left it (Consumer.Resume), without a sample twice.
//
// A ring slot is written again only when every consumer taking part in
// its epoch has released the batch it holds. A consumer copies a batch out
// of its mapping of the ring and checks the slot's word (internal/slots)
// afterwards, so a batch it hands out is never torn: a slot rewritten
// while it copied (possible only once the producer dropped it) is
// ErrDropped, not data. With Options.Views it hands out a read-only view
// of the slot instead, holds the slot until the loop's body returns, and
// checks the word then: a slot rewritten while the body read it is
// ErrDropped, the loop's next item. A batch it copies all the same (one
// straddling slots) frees each slot once copied, up to the first slot a
// view still holds.
//
// The producer waits for the slowest consumer for at most Config.MaxWait
// per slot, then drops the consumers still holding it; a consumer that
// does not heartbeat for Config.Heartbeat (a frozen process) is dropped,
// and one whose stream breaks (a dead process) at once. Nobody waits for a
// dropped consumer. Its next Batches reports ErrDropped, and the one
// after joins again: at the start of the producer's current epoch if that
// epoch's window is open (Config.Window: the first batches, still in the
// ring), else at the next epoch. A consumer that joins late within the
// window is served the batches it missed from the ring.
//
// No batch bytes cross the network for a consumer on the producer's
// filesystem: it maps the ring, and the stream carries announcements (a
// slot, a word, a batch's place) and acks. A consumer elsewhere gets the
// same batches as bytes on the same stream (lz4 when it pays, rpc's
// choice), which the node copies out of the ring once for all its
// consumers by bytes and each consumer receives into memory it reuses from
// batch to batch. A producer holds its ring folder alone (a lock file);
// killed, its consumers' loops end with an error matching
// rpc.ErrUnavailable, and a producer started again for the folder begins
// at the epoch after the last one begun, where the consumers join it.
//
// A loader whose batches come from a producer process instead
// (Service.AddRemote, "--loader NAME,producer=remote"; Python's
// tensorwire.loader.Producer over a torch DataLoader) is joined the same
// way. Dial, and a Batches loop that has yielded nothing yet, wait with
// backoff until ctx ends while no process is attached (ErrNoProducer); a
// process gone mid-epoch ends the loop with ErrNoProducer (it matches
// rpc.ErrUnavailable), and the next loop waits. The process's own failure (its
// data loader raised, a batch not of its schema) ends its consumers'
// epoch with ErrFailed and its message, also for a consumer whose join it
// answered just before it failed; a consumer that joins after it is gone
// waits for the next process, and the ErrNoProducer it gets when ctx ends
// names the failure.
//
// docs/loader.md in the repository describes the files, the protocol and
// what happens when a process dies.
package loader
