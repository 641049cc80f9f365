package replay

import (
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/rpc"
)

// Errors callers branch on, with errors.Is. A remote buffer's errors match
// the same values as a local one's, and also the rpc code each maps to
// (errors.Is(err, rpc.ErrInvalidArgument) for ErrSchema): each crosses the
// wire as its code and reason (see init), not by its message.
var (
	// ErrSchema: a batch whose keys, dtypes or shapes differ from the
	// buffer's schema, or that is not a batch of transitions; or indices
	// out of range. Nothing was written. Code InvalidArgument.
	ErrSchema = errors.New("replay: batch does not match the buffer")

	// ErrExpired: a reservation was not committed within its lease, or was
	// lost when the buffer node restarted; its slots went back to the writer
	// and nothing was added. Extend again. Code Aborted.
	ErrExpired = errors.New("replay: reservation expired")

	// ErrFull: every slot is reserved by writers that have not committed.
	// Code ResourceExhausted.
	ErrFull = errors.New("replay: every slot is reserved")

	// ErrClosed: the buffer or client was closed. Code FailedPrecondition.
	ErrClosed = errors.New("replay: closed")

	// ErrConfig: a Config that cannot make a buffer. Code InvalidArgument.
	ErrConfig = errors.New("replay: bad config")

	// ErrExists: Create found a buffer already at the prefix (Open it), or
	// Service.Add was given a name already served. Code AlreadyExists.
	ErrExists = errors.New("replay: a buffer exists at the prefix")

	// ErrNotFound: no buffer at the prefix (Open) or by that name on the
	// node (Dial). Code NotFound.
	ErrNotFound = errors.New("replay: no buffer")

	// ErrContended: a sample's rows kept being overwritten while they were
	// copied, more times than the buffer retries; nothing was sampled. Try
	// again, or sample fewer rows. Code Aborted.
	ErrContended = errors.New("replay: rows kept being overwritten while sampled")

	// ErrInUse: another Buffer holds the buffer at the prefix (Open,
	// Create), in another process or in this one; the error names its pid
	// and host. A buffer has one owner at a time. Code FailedPrecondition.
	ErrInUse = errors.New("replay: buffer in use")

	// ErrStorageLost: the buffer's files were deleted, replaced or
	// truncated under it (its folder removed while it was served, say), so
	// what it holds is gone or no longer where it was. The buffer then
	// refuses every call but Stats (StorageLost says why) and Close, and
	// acknowledges nothing more. Code DataLoss.
	ErrStorageLost = errors.New("replay: the buffer's storage is lost")

	// ErrArgument: a call's argument is bad whatever the buffer holds: a
	// sample of no transitions, or of more than one call may return.
	// Code InvalidArgument.
	ErrArgument = errors.New("replay: invalid argument")
)

// The code and reason each sentinel crosses the wire with. The reasons are
// the protocol (docs/replay.md, "Errors"): never change one; a message may
// change freely.
func init() {
	rpc.RegisterReason(ErrSchema, rpc.InvalidArgument, "replay.schema")
	rpc.RegisterReason(ErrExpired, rpc.Aborted, "replay.expired")
	rpc.RegisterReason(ErrFull, rpc.ResourceExhausted, "replay.full")
	rpc.RegisterReason(ErrClosed, rpc.FailedPrecondition, "replay.closed")
	rpc.RegisterReason(ErrConfig, rpc.InvalidArgument, "replay.config")
	rpc.RegisterReason(ErrExists, rpc.AlreadyExists, "replay.exists")
	rpc.RegisterReason(ErrNotFound, rpc.NotFound, "replay.not_found")
	rpc.RegisterReason(ErrContended, rpc.Aborted, "replay.contended")
	rpc.RegisterReason(ErrInUse, rpc.FailedPrecondition, "replay.in_use")
	rpc.RegisterReason(ErrStorageLost, rpc.DataLoss, "replay.storage_lost")
	rpc.RegisterReason(ErrArgument, rpc.InvalidArgument, "replay.argument")
}

// argumentErrorf returns an error matching ErrArgument.
func argumentErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrArgument, fmt.Sprintf(format, args...))
}

// schemaErrorf returns an error matching ErrSchema.
func schemaErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(format, args...))
}
