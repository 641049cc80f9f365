package benchkit

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// OnInterrupt returns a context that the first SIGINT or SIGTERM cancels,
// after logging msg (with the signal) at warning level, so that a benchmark
// program can stop and remove its files; a second signal gets the default
// action and ends the process at once. stop releases the signals and cancels
// the context; call it before the program returns.
func OnInterrupt(msg string) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-sigs:
			signal.Stop(sigs) // the next signal gets the default action
			slog.Warn(msg, "signal", s)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}
