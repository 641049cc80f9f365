// Package memmap provides Tensor: one n-dimensional array stored in a file and
// memory-mapped, so that many processes on one machine, or on machines sharing
// a filesystem, work on the same bytes without copying them.
//
// A file holds the raw elements in C order and little-endian byte order, with
// no header: exactly the leaf files PyTorch's tensordict writes (<key>.memmap).
// The dtype and shape live elsewhere (in tensordict's meta.json); Open takes
// them as arguments and checks that the file is long enough.
//
// # Lifetimes
//
// A Tensor owns one mapping from Create or Open until Close. Its methods
// (Gather, Scatter, ReadAt, WriteAt, Flush) are safe for concurrent use and
// return ErrClosed after Close; Close waits for calls in flight. Concurrent
// writes to the same rows race on the bytes just as writes to one file do:
// ordering them is the caller's job.
//
// Bytes returns a slice that aliases the mapping (tensordict builds its
// gorgonia Dense views on it). It is valid only until Close: reading or
// writing it afterwards is undefined and may crash the process, exactly like
// a slice of a bbolt page after its transaction ends. Keep the Tensor open
// for as long as a view is in use.
//
// # Faults
//
// A mapping raises SIGBUS when its file is truncated under it, or the disk
// under a sparse file fills. Create reserves the file's blocks up front
// (fallocate, or written zeros), so a full disk is an error at creation, and Open refuses a file
// shorter than its shape. Copies made by this package's methods turn a fault
// into ErrFault instead of killing the process; access through the slice
// from Bytes, or views built on it, is not guarded.
//
// # Durability
//
// Writes land in the page cache and are visible at once to every process that
// maps the file. Flush makes them durable: msync of the mapping, then fsync of
// the file. Close does not flush.
//
// # Platforms
//
// Files are mapped through github.com/edsrzf/mmap-go, so the package builds
// for Linux, macOS and Windows. Linux gets extras, each with a fallback
// elsewhere:
//
//   - Create reserves blocks with fallocate; elsewhere it writes the zeros
//     (the same guarantee, slower for large files).
//   - Gather and Scatter prefetch cold rows of 256 KiB or more (mincore,
//     MADV_WILLNEED); elsewhere cold rows fault in as the system reads ahead.
//   - Evict drops cached pages (madvise, posix_fadvise); elsewhere it
//     flushes and returns an error wrapping errors.ErrUnsupported.
//
// Faults become ErrFault everywhere. On Windows, ReadOnly maps the file
// read-only rather than copy-on-write, so a write through Bytes faults, and
// Close flushes (mmap-go's Unmap does there).
package memmap
