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
// (Gather, GatherTo, Scatter, ReadAt, WriteAt, Flush) are safe for
// concurrent use and return ErrClosed after Close; Close waits for calls in
// flight, but for GatherTo's, whose writer may wait on a slow peer: those
// keep the mapping until they return, and it is let go then. Concurrent
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
// into ErrFault instead of killing the process, as does GatherTo's write
// straight from the mapping to a descriptor (there the kernel copies, and
// reports the fault as EFAULT instead of a signal); access through the slice
// from Bytes, or views built on it, is not guarded: run it under Guard for
// the same promise. On Linux, writes to a sparse file (one opened with
// holes) reserve their rows' blocks first, so a full disk is an error
// wrapping ENOSPC there (see Writes).
//
// # Writes
//
// Scatter, Fill and WriteAt (and their view forms) copy through the mapping
// into pages that are in the page cache. On Linux, they write the pages
// that are not with pwrite on the file instead: through the mapping, each
// such 4 KiB page faults, and the kernel reads it from the disk before the
// copy overwrites it; pwrite skips both (a cold 6 MB fill: 0.7 ms instead
// of 17 ms). The page cache is what every mapping of the file shows, so
// every process that maps the file sees the bytes at once, exactly as after
// a write through the mapping, and Flush makes them durable the same way.
//
// A write is split into runs of consecutive rows (WriteAt is one run), in
// the order of the rows, so that a repeated row's last copy wins. A run of
// 64 KiB or more asks mincore which of its pages are resident and writes
// each stretch of resident pages through the mapping and each stretch of
// other pages with pwrite; a row that spans both is written partly each
// way. Smaller runs go through the mapping without asking. Either way
// exactly the rows' bytes are written, so the edge pages a row shares with
// its neighbours keep the neighbours' bytes. The Tensor keeps its file open
// until Close for this, and writes through the mapping alone when the file
// is opened with O_APPEND (OpenFile), with which Linux's pwrite appends, or
// when the file has become shorter than the data (so that a truncated file
// faults, as through the mapping, instead of growing back).
//
// For a sparse file (unless opened with O_APPEND), each write first
// reserves the blocks of all its runs (fallocate, keeping the file's size
// and bytes): when the disk is full the call returns an error wrapping
// ENOSPC and no row changes. The blocks of runs reserved before the one
// that did not fit stay allocated, reading as before. Any other error from
// pwrite (EIO) is returned wrapped; the rows before the failing stretch may
// have been written.
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
//   - Scatter, Fill and WriteAt write pages that are not in the page cache
//     with pwrite (see Writes); elsewhere they fault in through the
//     mapping.
//   - Gather prefetches cold rows of 256 KiB or more (mincore,
//     MADV_WILLNEED), as Scatter does when it cannot use pwrite; elsewhere
//     cold rows fault in as the system reads ahead.
//   - Evict drops cached pages (madvise, posix_fadvise); elsewhere it
//     flushes and returns an error wrapping errors.ErrUnsupported.
//
// Faults become ErrFault everywhere. On Windows, ReadOnly maps the file
// read-only rather than copy-on-write, so a write through Bytes faults, and
// Close flushes (mmap-go's Unmap does there).
package memmap
