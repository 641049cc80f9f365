package collective

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/collective.md, "Errors"); the messages are not.
var wireErrors = []svctest.Sentinel{
	{Err: ErrArgument, Code: rpc.ErrInvalidArgument, Reason: "collective.argument"},
	{Err: ErrMismatch, Code: rpc.ErrInvalidArgument, Reason: "collective.mismatch"},
	{Err: ErrPeerLost, Code: rpc.ErrUnavailable, Reason: "collective.peer_lost"},
	{Err: ErrAborted, Code: rpc.ErrAborted, Reason: "collective.aborted"},
	{Err: ErrBroken, Code: rpc.ErrFailedPrecondition, Reason: "collective.broken"},
	{Err: ErrClosed, Code: rpc.ErrFailedPrecondition, Reason: "collective.closed"},
	{Err: ErrWaited, Code: rpc.ErrFailedPrecondition, Reason: "collective.waited"},
	{Err: ErrNoAdjoint, Code: rpc.ErrFailedPrecondition, Reason: "collective.no_adjoint"},
	{Err: ErrNoSpace, Code: rpc.ErrResourceExhausted, Reason: "collective.no_space"},
	{Err: ErrConfig, Code: rpc.ErrInvalidArgument, Reason: "collective.config"},
	{Err: ErrJoin, Code: rpc.ErrUnavailable, Reason: "collective.join"},
	{Err: ErrUnauthenticated, Code: rpc.ErrUnauthenticated, Reason: "collective.unauthenticated"},
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	svctest.CrossTheWire(t, wireErrors)
}
