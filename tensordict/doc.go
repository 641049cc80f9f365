// Package tensordict provides TensorDict: an ordered, nested dictionary of
// tensors that share leading batch dimensions, after PyTorch's tensordict,
// stored in memory or as memory-mapped files in tensordict's on-disk format.
//
// A TensorDict of batch size [N, ...] holds Tensors whose shapes start with
// [N, ...], nested TensorDicts whose batch sizes start with it, and
// JSON-able NonTensor values. Indexing by row (Index, Slice) gives views that
// share storage; Gather and Mask give copies in Go memory; SetRows and
// SetSlice write rows in place, which on a memory-mapped TensorDict writes
// the files.
//
// # Schemas
//
// Two types describe tensors without holding them. Field has the full
// shape, batch dimensions included: Create takes Fields, and
// TensorDict.Schema returns them. RowField has the shape of one row,
// without the batch dimensions: a RowSchema is what a replay buffer's
// transition, a served model's input or a loader's sample looks like, and
// it makes batches of any size (RowSchema.Fields, Zeros, Create);
// TensorDict.RowSchema goes back. Both encode as {"key", "dtype", "shape"}
// in JSON and on the rpc wire, the dtype as its torch name.
//
// # On disk
//
// Memmap writes a TensorDict to a folder (a prefix) the way tensordict's
// td.memmap(prefix) does, and LoadMemmap maps one back, whether this package
// or Python wrote it: a folder per TensorDict with a meta.json, one
// <key>.memmap file of raw little-endian elements per tensor. MemmapLike
// makes zero-filled storage of the same schema without copying data.
// docs/format.md in the repository says exactly what is read, written and
// refused.
//
// # Lifetimes and concurrency
//
// A memory-mapped TensorDict (from Memmap, MemmapLike or LoadMemmap) owns
// its mappings until Close; the views and Tensors taken from it share them.
// After Close their data methods return errors wrapping memmap.ErrClosed;
// slices from Tensor.Bytes and Dense views must not be used at all. Its keys
// are fixed (Set and Delete return ErrLocked), its tensors writable unless it
// was loaded read-only.
//
// A TensorDict's structure (Set, Delete) is not safe for concurrent
// mutation; reading structure and reading or writing tensor data from many
// goroutines is, with the usual caveat that concurrent writes to the same
// rows race.
package tensordict
