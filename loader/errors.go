package loader

import (
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/rpc"
)

// Errors callers branch on, with errors.Is. A consumer's errors from a
// remote producer match the same values as a local one's, and also the rpc
// code each maps to: each crosses the wire as its code and reason (see
// init), not by its message.
var (
	// ErrConfig: a Config that cannot make a producer (a batch size of 0,
	// a window larger than the ring...). Nothing was made. Code
	// InvalidArgument.
	ErrConfig = errors.New("loader: bad config")

	// ErrDataset: the dataset prefix holds no TensorDict (missing, not a
	// memory-mapped TensorDict, unreadable), or one with no rows or no
	// tensors, or a transform refused its fields. Nothing was made. Code
	// FailedPrecondition.
	ErrDataset = errors.New("loader: bad dataset")

	// ErrArgument: a consumer's argument is bad whatever the producer
	// holds: a batch size of 0 or less, or larger than the ring (Slots ×
	// Batch rows). Code InvalidArgument.
	ErrArgument = errors.New("loader: invalid argument")

	// ErrNotFound: the node serves no loader by that name. Code NotFound.
	ErrNotFound = errors.New("loader: no loader")

	// ErrDropped: the producer no longer counts this consumer: it stopped
	// heartbeating for Config.Heartbeat, held a batch for longer than
	// Config.MaxWait, acked a batch the producer never had, or the
	// producer restarted. The rest of the epoch is lost to it; the next
	// call of Batches joins again, at the start of the current epoch if
	// its window is still open, else of the next one. Code Aborted.
	ErrDropped = errors.New("loader: consumer dropped by the producer")

	// ErrClosed: the producer or the consumer was closed. Code
	// FailedPrecondition.
	ErrClosed = errors.New("loader: closed")

	// ErrFailed: the producer stopped on an error it cannot get past: the
	// transform failed, or the dataset's files were truncated under it.
	// The error says which. Code FailedPrecondition.
	ErrFailed = errors.New("loader: producer failed")

	// ErrInUse: another producer, in this process or another, holds the
	// ring folder (Config.Dir); the error names its pid and host. Code
	// FailedPrecondition.
	ErrInUse = errors.New("loader: ring folder in use")

	// ErrExists: the ring folder holds files that are not a loader's ring:
	// a producer never deletes what is not its own; also Service.Add of a
	// name already served. Code AlreadyExists.
	ErrExists = errors.New("loader: ring folder holds something else")
)

// The code and reason each sentinel crosses the wire with. The reasons are
// the protocol (docs/loader.md, "Errors"): never change one; a message may
// change freely.
func init() {
	rpc.RegisterReason(ErrConfig, rpc.InvalidArgument, "loader.config")
	rpc.RegisterReason(ErrDataset, rpc.FailedPrecondition, "loader.dataset")
	rpc.RegisterReason(ErrArgument, rpc.InvalidArgument, "loader.argument")
	rpc.RegisterReason(ErrNotFound, rpc.NotFound, "loader.not_found")
	rpc.RegisterReason(ErrDropped, rpc.Aborted, "loader.dropped")
	rpc.RegisterReason(ErrClosed, rpc.FailedPrecondition, "loader.closed")
	rpc.RegisterReason(ErrFailed, rpc.FailedPrecondition, "loader.failed")
	rpc.RegisterReason(ErrInUse, rpc.FailedPrecondition, "loader.in_use")
	rpc.RegisterReason(ErrExists, rpc.AlreadyExists, "loader.exists")
}

// wrapf returns an error matching sentinel, with a message.
func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// ErrNoProducer: the loader's batches come from a producer process
// (Config.Producer "remote") and none is attached: it has not attached
// yet, or it went away (killed, closed, or silent: it filled no granted
// slot within Config.GrantWait) during the epoch. A consumer's
// iteration waits for one to attach, as it waits for a node that restarts;
// an epoch of which batches were yielded ends with it. Code Unavailable:
// it matches rpc.ErrUnavailable.
var ErrNoProducer = errors.New("loader: no producer attached")

func init() { rpc.RegisterReason(ErrNoProducer, rpc.Unavailable, "loader.no_producer") }
