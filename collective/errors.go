package collective

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/tensorwire/tensorwire/rpc"
)

// Errors callers branch on, with errors.Is. Each also matches the rpc code
// it maps to (errors.Is(err, rpc.ErrUnavailable) for ErrPeerLost), here and
// on the other side of a call: each crosses the wire as its code and reason
// (see init).
var (
	// ErrArgument: a call's argument is bad on some rank: a root or rank
	// out of range, an axis the tensor does not have, counts that do not
	// sum to the axis' length, a dtype the reduction does not take, a
	// missing tensor. Every rank of a collective gets it (naming the rank
	// at fault), and the communicator stays usable. Code InvalidArgument.
	ErrArgument = errors.New("collective: invalid argument")

	// ErrMismatch: the ranks called different collectives, or the same one
	// with tensors that do not fit together (dtypes, shapes), or with
	// different roots, axes, operations or counts. Every rank gets it, and
	// the communicator stays usable. Code InvalidArgument.
	ErrMismatch = errors.New("collective: ranks disagree")

	// ErrPeerLost: a rank died, closed its communicator or became
	// unreachable while this one needed it. Every pending and later
	// operation fails with it; form a new communicator (Join). Code
	// Unavailable.
	ErrPeerLost = errors.New("collective: a rank is gone")

	// ErrAborted: another rank abandoned the operation part-way (its
	// context ended, or it failed for a reason of its own, such as a
	// fault on one of its tensors), so this one cannot complete. The communicator is
	// broken, as after ErrPeerLost. Code Aborted.
	ErrAborted = errors.New("collective: operation abandoned by another rank")

	// ErrBroken: an earlier operation failed part-way (a rank was lost, or
	// an operation was abandoned on some rank), so the ranks no longer
	// agree on where they are. Every later call fails with it, wrapping the
	// first cause; form a new communicator (Join). Code FailedPrecondition.
	ErrBroken = errors.New("collective: communicator broken")

	// ErrClosed: the communicator was closed. Code FailedPrecondition.
	ErrClosed = errors.New("collective: closed")

	// ErrWaited: Wait on a Request that was waited for already. Code
	// FailedPrecondition.
	ErrWaited = errors.New("collective: request already waited for")

	// ErrNoAdjoint: the adjoint of an operation that has none: a reduction
	// other than Sum (Max, Min, Prod and the logical and bitwise ones), or
	// a Tape replayed twice. Code FailedPrecondition.
	ErrNoAdjoint = errors.New("collective: no adjoint")

	// ErrNoSpace: a rank could not reserve room in the shared folder
	// (Config.ShmDir, a memory filesystem) for what it publishes: the
	// folder is full. Every rank of the collective gets it (naming the rank
	// at fault), before any data moves, and the communicator stays usable:
	// smaller tensors, or the same once room is freed, go through. It wraps
	// syscall.ENOSPC, so errors.Is(err, syscall.ENOSPC) holds too (in this
	// process; across the wire it matches by its reason). Code
	// ResourceExhausted.
	ErrNoSpace = fmt.Errorf("collective: no room in the shared folder: %w", syscall.ENOSPC)

	// ErrConfig: a Config that cannot form a communicator. Code
	// InvalidArgument.
	ErrConfig = errors.New("collective: bad config")

	// ErrUnauthenticated: a rank could not authenticate another during Join:
	// their Config.Token (or TLS) differ, or one has none. It is final: Join
	// does not retry it, and fails with it on the rank that was refused, on
	// rank 0 (which refused it) and on every rank waiting at rank 0's
	// rendezvous, without waiting for ctx to end. It also matches
	// rpc.ErrUnauthenticated. Code Unauthenticated.
	ErrUnauthenticated = errors.New("collective: authentication failed")

	// ErrJoin: the ranks could not form a communicator: two ranks claimed
	// the same rank, the sizes differ, or the ranks did not all arrive
	// before the context ended. Code Unavailable.
	ErrJoin = errors.New("collective: could not form the communicator")
)

// The code and reason each sentinel crosses the wire with. The reasons are
// part of the protocol (docs/collective.md): never change one.
func init() {
	rpc.RegisterReason(ErrArgument, rpc.InvalidArgument, "collective.argument")
	rpc.RegisterReason(ErrMismatch, rpc.InvalidArgument, "collective.mismatch")
	rpc.RegisterReason(ErrPeerLost, rpc.Unavailable, "collective.peer_lost")
	rpc.RegisterReason(ErrAborted, rpc.Aborted, "collective.aborted")
	rpc.RegisterReason(ErrBroken, rpc.FailedPrecondition, "collective.broken")
	rpc.RegisterReason(ErrClosed, rpc.FailedPrecondition, "collective.closed")
	rpc.RegisterReason(ErrWaited, rpc.FailedPrecondition, "collective.waited")
	rpc.RegisterReason(ErrNoAdjoint, rpc.FailedPrecondition, "collective.no_adjoint")
	rpc.RegisterReason(ErrNoSpace, rpc.ResourceExhausted, "collective.no_space")
	rpc.RegisterReason(ErrConfig, rpc.InvalidArgument, "collective.config")
	rpc.RegisterReason(ErrJoin, rpc.Unavailable, "collective.join")
	rpc.RegisterReason(ErrUnauthenticated, rpc.Unauthenticated, "collective.unauthenticated")
}

// errorf returns an *rpc.Error with the code registered for sentinel, a
// message and sentinel as its cause, so that it matches both sentinel and
// the code's rpc sentinel.
func errorf(sentinel error, format string, args ...any) error {
	code := rpc.CodeOf(sentinel)
	return rpc.Errorf(code, "%w: %s", sentinel, fmt.Sprintf(format, args...))
}

func argumentf(format string, args ...any) error { return errorf(ErrArgument, format, args...) }
func mismatchf(format string, args ...any) error { return errorf(ErrMismatch, format, args...) }

// rankList formats a set of ranks (ascending) for a message, in runs
// ("1-3, 7, 9-1023"), at most 16 runs then how many ranks more: an error
// names a few ranks, never all of a large communicator.
func rankList(ranks []int) string {
	const most = 16
	var b strings.Builder
	runs := 0
	for i := 0; i < len(ranks); {
		j := i
		for j+1 < len(ranks) && ranks[j+1] == ranks[j]+1 {
			j++
		}
		if runs == most {
			fmt.Fprintf(&b, " and %d more", len(ranks)-i)
			break
		}
		if runs > 0 {
			b.WriteString(", ")
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ranks[i], ranks[j])
		} else {
			fmt.Fprintf(&b, "%d", ranks[i])
		}
		runs++
		i = j + 1
	}
	return b.String()
}

// intList formats a list of ints (counts, per rank) for a message: all of
// them up to 16, else the first 16 and how many there are.
func intList(v []int) string {
	const most = 16
	if len(v) <= most {
		return fmt.Sprint(v)
	}
	return strings.TrimSuffix(fmt.Sprint(v[:most]), "]") + fmt.Sprintf(" ... (%d in all)]", len(v))
}
