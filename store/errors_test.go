package store

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/store.md, "Errors"); the messages are not.
var wireErrors = []svctest.Sentinel{
	{Err: ErrName, Code: rpc.ErrInvalidArgument, Reason: "store.name"},
	{Err: ErrTooLarge, Code: rpc.ErrResourceExhausted, Reason: "store.too_large"},
	{Err: ErrNotFound, Code: rpc.ErrNotFound, Reason: "store.not_found"},
	{Err: ErrCompacted, Code: rpc.ErrOutOfRange, Reason: "store.compacted"},
	{Err: ErrExpired, Code: rpc.ErrAborted, Reason: "store.expired"},
	{Err: ErrLocked, Code: rpc.ErrFailedPrecondition, Reason: "store.locked"},
	{Err: ErrClosed, Code: rpc.ErrFailedPrecondition, Reason: "store.closed"},
	{Err: ErrNotStaged, Code: rpc.ErrInvalidArgument, Reason: "store.not_staged"},
	{Err: ErrFormat, Code: rpc.ErrInvalidArgument, Reason: "store.format"},
	{Err: ErrCorrupt, Code: rpc.ErrDataLoss, Reason: "store.corrupt"},
	{Err: ErrFailed, Code: rpc.ErrFailedPrecondition, Reason: "store.failed"},
	{Err: ErrConfig, Code: rpc.ErrInvalidArgument, Reason: "store.config"},
	{Err: ErrExists, Code: rpc.ErrAlreadyExists, Reason: "store.exists"},
	{Err: ErrLost, Code: rpc.ErrFailedPrecondition, Reason: "store.lost"},
	{Err: ErrMissing, Code: rpc.ErrDataLoss, Reason: "store.missing"},
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	svctest.CrossTheWire(t, wireErrors)
}
