package benchkit

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// OnInterrupt returns a context that the first SIGINT or SIGTERM cancels
// (context.Cause then names the signal), so that a benchmark program can
// stop and remove its files; from then on the signals get their default
// action again, so that a second one ends the process at once. The context
// also ends with parent, or when stop is called; call stop before the
// program returns.
//
// It is signal.NotifyContext, which alone would keep catching every later
// signal until stop, and context.AfterFunc, which releases the signals as
// soon as the context ends.
func OnInterrupt(parent context.Context) (ctx context.Context, stop context.CancelFunc) {
	ctx, stop = signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}
