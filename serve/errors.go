package serve

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Errors callers branch on, with errors.Is. A remote manager's errors match
// the same values as a local one's, and also the rpc code each maps to
// (errors.Is(err, rpc.ErrResourceExhausted) for ErrQueueFull): each crosses
// the wire as its code and reason (see init), not by its message.
var (
	// ErrConfig: a Config that cannot make a manager, or a call the
	// manager's models cannot do (Load on models that are not Loaders).
	// Code InvalidArgument.
	ErrConfig = errors.New("serve: bad config")

	// ErrSchema: an input whose keys, dtypes or row shapes differ from the
	// model's input schema, that is not a batch of rows, that holds more
	// rows than the maximum batch or than the client's slots, or a client
	// buffer that does not match the schemas. Nothing was queued. The
	// message says what is wrong: which input or slots, which key, its
	// dtype or row shape and the model's. Code InvalidArgument.
	ErrSchema = errors.New("serve: does not fit the model")

	// ErrQueueFull: the manager holds Config.MaxQueue rows waiting for a
	// replica already; nothing was queued. Back off and try again (Triton's
	// queue policy). Code ResourceExhausted.
	ErrQueueFull = errors.New("serve: queue full")

	// ErrForward: the model's Forward returned an error or panicked on the
	// batch the request was in, or returned outputs that do not match the
	// output schema; the message says which. The replica that ran it is
	// replaced (an attached replica: detached). Also a batch whose attached
	// replicas went away before answering, maxTries of them, or the last
	// with none attaching within Config.AttachWait. Code Internal.
	ErrForward = errors.New("serve: forward failed")

	// ErrParams: Load's parameters do not fit the model (its Load refused
	// them); no replica switched to them. Code InvalidArgument.
	ErrParams = errors.New("serve: parameters do not fit the model")

	// ErrNoParams: a prediction before the manager loaded any parameters,
	// when its models need some (ParamsNeeder: serve/mlp's MLP, whose
	// weights are zero until its first Load). Nothing was queued. Load
	// parameters first (Manager.Load, LoadVersion, Follow). Code
	// FailedPrecondition.
	ErrNoParams = errors.New("serve: no parameters loaded")

	// ErrVersion: LoadVersion of a version not newer than the manager's
	// latest. Code FailedPrecondition.
	ErrVersion = errors.New("serve: version not newer than the latest")

	// ErrStopped: the manager was closed; requests still queued when it
	// closed get it, and those of a batch whose Forward failed once Close
	// ended its context. Code Unavailable, so that a remote client retries,
	// as it does while its node restarts.
	ErrStopped = errors.New("serve: manager stopped")

	// ErrClosed: the client was closed. Code FailedPrecondition.
	ErrClosed = errors.New("serve: closed")

	// ErrNotFound: no model by that name on the node (Dial). Code
	// NotFound.
	ErrNotFound = errors.New("serve: no model")

	// ErrExists: Service.Add of a name already served. Code AlreadyExists.
	ErrExists = errors.New("serve: a model of that name is served")

	// ErrNotRegistered: a request for a client registration the node does
	// not hold: its lease ran out, or the node restarted. A Client
	// registers again by itself. Code NotFound.
	ErrNotRegistered = errors.New("serve: client not registered")

	// ErrNoReplica: the request waited Config.AttachWait while the model
	// had no replica (its replicas are all attached processes,
	// Config.AttachedOnly, and none was attached, or the last went away).
	// Code FailedPrecondition: a client does not retry it by itself.
	ErrNoReplica = errors.New("serve: no replica attached")
)

// The code and reason each sentinel crosses the wire with. The reasons are
// the protocol (docs/serve.md, "Errors"): never change one; a message may
// change freely.
func init() {
	rpc.RegisterReason(ErrConfig, rpc.InvalidArgument, "serve.config")
	rpc.RegisterReason(ErrSchema, rpc.InvalidArgument, "serve.schema")
	rpc.RegisterReason(ErrNoParams, rpc.FailedPrecondition, "serve.no_params")
	rpc.RegisterReason(ErrQueueFull, rpc.ResourceExhausted, "serve.queue_full")
	rpc.RegisterReason(ErrForward, rpc.Internal, "serve.forward")
	rpc.RegisterReason(ErrParams, rpc.InvalidArgument, "serve.params")
	rpc.RegisterReason(ErrVersion, rpc.FailedPrecondition, "serve.version")
	rpc.RegisterReason(ErrStopped, rpc.Unavailable, "serve.stopped")
	rpc.RegisterReason(ErrClosed, rpc.FailedPrecondition, "serve.closed")
	rpc.RegisterReason(ErrNotFound, rpc.NotFound, "serve.not_found")
	rpc.RegisterReason(ErrExists, rpc.AlreadyExists, "serve.exists")
	rpc.RegisterReason(ErrNotRegistered, rpc.NotFound, "serve.not_registered")
	rpc.RegisterReason(ErrNoReplica, rpc.FailedPrecondition, "serve.no_replica")
}

// schemaErrorf returns an error matching ErrSchema.
func schemaErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSchema, fmt.Sprintf(format, args...))
}

// configErrorf returns an error matching ErrConfig.
func configErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// schemaDiff returns what differs between got, the fields of a batch of
// rows (an input, a client's slots), and want, the model's schema: each
// field missing, not in the schema, or of another dtype or row shape,
// "" when none does. At most 8 differences are listed, then a count.
func schemaDiff(want, got tensordict.RowSchema) string {
	key := func(k []string) string { return strings.Join(k, "\x00") }
	have := make(map[string]tensordict.RowField, len(got))
	for _, g := range got {
		have[key(g.Key)] = g
	}
	var diffs []string
	for _, w := range want {
		g, ok := have[key(w.Key)]
		switch {
		case !ok:
			diffs = append(diffs, fmt.Sprintf("key %v is missing (want %v%v)", w.Key, w.DType, w.Shape))
		case g.DType != w.DType && !slices.Equal(g.Shape, w.Shape):
			diffs = append(diffs, fmt.Sprintf("key %v is %v%v per row, want %v%v", w.Key, g.DType, g.Shape, w.DType, w.Shape))
		case g.DType != w.DType:
			diffs = append(diffs, fmt.Sprintf("key %v has dtype %v, want %v", w.Key, g.DType, w.DType))
		case !slices.Equal(g.Shape, w.Shape):
			diffs = append(diffs, fmt.Sprintf("key %v has shape %v per row, want %v", w.Key, g.Shape, w.Shape))
		}
		delete(have, key(w.Key))
	}
	for _, g := range got {
		if _, extra := have[key(g.Key)]; extra {
			diffs = append(diffs, fmt.Sprintf("key %v (%v%v) is not in the model's schema", g.Key, g.DType, g.Shape))
		}
	}
	const most = 8
	if len(diffs) > most {
		diffs = append(diffs[:most], fmt.Sprintf("and %d more", len(diffs)-most))
	}
	return strings.Join(diffs, "; ")
}
