package replay

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/replay.md, "Errors"); the messages are not.
var wireErrors = []svctest.Sentinel{
	{Err: ErrSchema, Code: rpc.ErrInvalidArgument, Reason: "replay.schema"},
	{Err: ErrExpired, Code: rpc.ErrAborted, Reason: "replay.expired"},
	{Err: ErrFull, Code: rpc.ErrResourceExhausted, Reason: "replay.full"},
	{Err: ErrClosed, Code: rpc.ErrFailedPrecondition, Reason: "replay.closed"},
	{Err: ErrConfig, Code: rpc.ErrInvalidArgument, Reason: "replay.config"},
	{Err: ErrExists, Code: rpc.ErrAlreadyExists, Reason: "replay.exists"},
	{Err: ErrNotFound, Code: rpc.ErrNotFound, Reason: "replay.not_found"},
	{Err: ErrContended, Code: rpc.ErrAborted, Reason: "replay.contended"},
	{Err: ErrInUse, Code: rpc.ErrFailedPrecondition, Reason: "replay.in_use"},
	{Err: ErrStorageLost, Code: rpc.ErrDataLoss, Reason: "replay.storage_lost"},
	{Err: ErrArgument, Code: rpc.ErrInvalidArgument, Reason: "replay.argument"},
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	svctest.CrossTheWire(t, wireErrors)
}
