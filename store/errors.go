package store

import (
	"errors"
	"fmt"

	"github.com/tensorwire/tensorwire/rpc"
)

// Errors callers branch on, with errors.Is. A remote store's errors match
// the same values as a local one's, and also the rpc code each maps to
// (errors.Is(err, rpc.ErrInvalidArgument) for ErrName): each crosses the
// wire as its code and reason (see init), not by its message.
var (
	// ErrName: a bin or parameter name that is empty, longer than
	// MaxNameBytes, not UTF-8, "." or "..", or holds '/', '\', NUL or
	// another control character. Nothing was done. Code InvalidArgument.
	ErrName = errors.New("store: bad name")

	// ErrTooLarge: a value larger than the store's Options.MaxValueBytes,
	// or an Extend whose values kept in the log pass 1 GiB together.
	// Nothing was stored. Code ResourceExhausted.
	ErrTooLarge = errors.New("store: value too large")

	// ErrNotFound: no store by that name on the node (Dial, Open), or no
	// parameters published under the name (Latest). Code NotFound.
	ErrNotFound = errors.New("store: not found")

	// ErrCompacted: a watch asked for events after a revision the store no
	// longer keeps. Read the state again (List, Peek) and watch from its
	// revision (etcd's contract). Code OutOfRange.
	ErrCompacted = errors.New("store: revision compacted")

	// ErrExpired: a Get whose items changed before it was acknowledged (a
	// Put or Delete replaced them, its reservation ran out, or the node
	// restarted), so nothing was removed; or a parameter lease that ran out
	// and whose version is gone. Client.Get retries the first case itself.
	// Code Aborted.
	ErrExpired = errors.New("store: expired")

	// ErrLocked: another process serves the store's folder, or another
	// Store of this process has it open (Open); the message says which, and
	// names the other process. Code FailedPrecondition.
	ErrLocked = errors.New("store: in use")

	// ErrClosed: the store or client was closed. Code FailedPrecondition.
	ErrClosed = errors.New("store: closed")

	// ErrNotStaged: a value sent by reference that is not a prefix in the
	// store's staging folder (Client.StagingDir); it was left where it was.
	// Code InvalidArgument.
	ErrNotStaged = errors.New("store: not a staged prefix")

	// ErrFormat: a stored value or a rollout that cannot be decoded, or a
	// staged prefix that is not a TensorDict. Code InvalidArgument.
	ErrFormat = errors.New("store: bad value")

	// ErrCorrupt: the store's log is damaged before its end, with
	// acknowledged operations after the damage; Open refuses to guess.
	// Code DataLoss.
	ErrCorrupt = errors.New("store: log damaged")

	// ErrFailed: a write to the store's log failed (a full disk, say); the
	// store refuses every call from then on, and a restart recovers every
	// acknowledged operation. Code FailedPrecondition.
	ErrFailed = errors.New("store: log write failed")

	// ErrConfig: Options that cannot make a store. Code InvalidArgument.
	ErrConfig = errors.New("store: bad options")

	// ErrExists: Open was given a folder that holds files but is not a
	// store (no store.log), or a store's folder where one of the store's
	// own files or folders (store.log, LOCK, values/, staging/, trash/) is
	// a symbolic link or of the wrong kind. Open touches nothing then: a
	// store never deletes what it did not make, nor follows a link out of
	// its folder. Also Service.Add of a name already served. Code
	// AlreadyExists.
	ErrExists = errors.New("store: folder holds something else")

	// ErrLost: the store's log was removed (deleted, renamed or replaced),
	// or one of its folders replaced, under a running store: it stops
	// acknowledging, and every call fails with ErrLost until a person
	// decides (Repair). Also Open of a folder holding a store's files but
	// no log: it refuses to start a new store over them.
	// Code FailedPrecondition.
	ErrLost = errors.New("store: the store's log was removed")

	// ErrMissing: a value's folder under values/ is missing (deleted under
	// the store): the item or parameter version the message names is lost,
	// and only it. Get and Peek return a bin's other items, and fail with
	// ErrMissing for a bin that holds nothing else; Latest and WaitNewer
	// fail with it until a newer version is published. Options.Repair
	// drops lost items. Code DataLoss.
	ErrMissing = errors.New("store: value missing")
)

// The code and reason each sentinel crosses the wire with. The reasons are
// the protocol (docs/store.md, "Errors"): never change one; a message may
// change freely.
func init() {
	rpc.RegisterReason(ErrName, rpc.InvalidArgument, "store.name")
	rpc.RegisterReason(ErrTooLarge, rpc.ResourceExhausted, "store.too_large")
	rpc.RegisterReason(ErrNotFound, rpc.NotFound, "store.not_found")
	rpc.RegisterReason(ErrCompacted, rpc.OutOfRange, "store.compacted")
	rpc.RegisterReason(ErrExpired, rpc.Aborted, "store.expired")
	rpc.RegisterReason(ErrLocked, rpc.FailedPrecondition, "store.locked")
	rpc.RegisterReason(ErrClosed, rpc.FailedPrecondition, "store.closed")
	rpc.RegisterReason(ErrNotStaged, rpc.InvalidArgument, "store.not_staged")
	rpc.RegisterReason(ErrFormat, rpc.InvalidArgument, "store.format")
	rpc.RegisterReason(ErrCorrupt, rpc.DataLoss, "store.corrupt")
	rpc.RegisterReason(ErrFailed, rpc.FailedPrecondition, "store.failed")
	rpc.RegisterReason(ErrConfig, rpc.InvalidArgument, "store.config")
	rpc.RegisterReason(ErrExists, rpc.AlreadyExists, "store.exists")
	rpc.RegisterReason(ErrLost, rpc.FailedPrecondition, "store.lost")
	rpc.RegisterReason(ErrMissing, rpc.DataLoss, "store.missing")
}

// errorf returns an error matching sentinel, with a message.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
