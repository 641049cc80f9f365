package replay

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tensorwire/tensorwire/rpc"
)

// Errors callers branch on, with errors.Is. A remote buffer's errors match
// the same values as a local one's, and also the rpc code each maps to
// (errors.Is(err, rpc.ErrInvalidArgument) for ErrSchema).
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

	// ErrExists: Create found a buffer already at the prefix; Open it.
	// Code AlreadyExists.
	ErrExists = errors.New("replay: a buffer exists at the prefix")

	// ErrNotFound: no buffer at the prefix (Open) or by that name on the
	// node (Dial). Code NotFound.
	ErrNotFound = errors.New("replay: no buffer")

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

// codes maps the sentinels to the codes their errors cross the wire with.
var codes = []struct {
	err  error
	code rpc.Code
}{
	{ErrSchema, rpc.InvalidArgument},
	{ErrExpired, rpc.Aborted},
	{ErrFull, rpc.ResourceExhausted},
	{ErrClosed, rpc.FailedPrecondition},
	{ErrConfig, rpc.InvalidArgument},
	{ErrExists, rpc.AlreadyExists},
	{ErrNotFound, rpc.NotFound},
	{ErrInUse, rpc.FailedPrecondition},
	{ErrStorageLost, rpc.DataLoss},
	{ErrArgument, rpc.InvalidArgument},
}

// toWire gives err the code its sentinel maps to, for a handler to return.
// Its message keeps the sentinel's text first, which is how fromWire finds
// the sentinel again on the other side.
func toWire(err error) error {
	if err == nil {
		return nil
	}
	var re *rpc.Error
	if errors.As(err, &re) {
		return err
	}
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return rpc.Errorf(c.code, "%w", err)
		}
	}
	return rpc.Errorf(rpc.CodeOf(err), "%w", err)
}

// fromWire makes an error returned by a replay call match its sentinel
// again, besides its rpc code.
func fromWire(err error) error {
	var re *rpc.Error
	if !errors.As(err, &re) {
		return err
	}
	for _, c := range codes {
		if re.Code == c.code && strings.HasPrefix(re.Msg, c.err.Error()) {
			return &wireError{sentinel: c.err, err: err}
		}
	}
	return err
}

// wireError is a remote error that matches both its sentinel and its rpc
// code.
type wireError struct {
	sentinel error
	err      error
}

func (e *wireError) Error() string   { return e.err.Error() }
func (e *wireError) Unwrap() []error { return []error{e.sentinel, e.err} }

// argumentErrorf returns an error matching ErrArgument.
func argumentErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrArgument, fmt.Sprintf(format, args...))
}

// schemaErrorf returns an error matching ErrSchema.
func schemaErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(format, args...))
}
