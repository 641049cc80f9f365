package loader

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/loader.md, "Errors"); the messages are not.
var wireErrors = []svctest.Sentinel{
	{Err: ErrConfig, Code: rpc.ErrInvalidArgument, Reason: "loader.config"},
	{Err: ErrDataset, Code: rpc.ErrFailedPrecondition, Reason: "loader.dataset"},
	{Err: ErrArgument, Code: rpc.ErrInvalidArgument, Reason: "loader.argument"},
	{Err: ErrNotFound, Code: rpc.ErrNotFound, Reason: "loader.not_found"},
	{Err: ErrDropped, Code: rpc.ErrAborted, Reason: "loader.dropped"},
	{Err: ErrClosed, Code: rpc.ErrFailedPrecondition, Reason: "loader.closed"},
	{Err: ErrFailed, Code: rpc.ErrFailedPrecondition, Reason: "loader.failed"},
	{Err: ErrInUse, Code: rpc.ErrFailedPrecondition, Reason: "loader.in_use"},
	{Err: ErrExists, Code: rpc.ErrAlreadyExists, Reason: "loader.exists"},
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	svctest.CrossTheWire(t, wireErrors)
}
