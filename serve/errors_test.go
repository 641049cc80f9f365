package serve

import (
	"testing"

	"github.com/tensorwire/tensorwire/internal/testkit/svctest"
	"github.com/tensorwire/tensorwire/rpc"
)

// wireErrors pins each sentinel's code and reason: the reasons are part of
// the protocol (docs/serve.md, "Errors"); the messages are not.
var wireErrors = []svctest.Sentinel{
	{Err: ErrConfig, Code: rpc.ErrInvalidArgument, Reason: "serve.config"},
	{Err: ErrSchema, Code: rpc.ErrInvalidArgument, Reason: "serve.schema"},
	{Err: ErrQueueFull, Code: rpc.ErrResourceExhausted, Reason: "serve.queue_full"},
	{Err: ErrForward, Code: rpc.ErrInternal, Reason: "serve.forward"},
	{Err: ErrParams, Code: rpc.ErrInvalidArgument, Reason: "serve.params"},
	{Err: ErrNoParams, Code: rpc.ErrFailedPrecondition, Reason: "serve.no_params"},
	{Err: ErrVersion, Code: rpc.ErrFailedPrecondition, Reason: "serve.version"},
	{Err: ErrStopped, Code: rpc.ErrUnavailable, Reason: "serve.stopped"},
	{Err: ErrClosed, Code: rpc.ErrFailedPrecondition, Reason: "serve.closed"},
	{Err: ErrNotFound, Code: rpc.ErrNotFound, Reason: "serve.not_found"},
	{Err: ErrExists, Code: rpc.ErrAlreadyExists, Reason: "serve.exists"},
	{Err: ErrNotRegistered, Code: rpc.ErrNotFound, Reason: "serve.not_registered"},
}

// TestErrors_CrossTheWire has a handler return each sentinel in a message
// that does not begin with the sentinel's text: the caller's error carries
// the sentinel's reason and matches the sentinel and its code, and no other
// sentinel.
func TestErrors_CrossTheWire(t *testing.T) {
	svctest.CrossTheWire(t, wireErrors)
}
