package faulttest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// roleEnv names the environment variable that makes this test binary a
// scenario's helper process instead of running tests: its value is a key of
// roles. Helpers run in their own network namespaces (netns.Host.Command)
// and talk to their test through stdout, a line per event.
const roleEnv = "TENSORWIRE_FAULTTEST_ROLE"

// roles are the helper processes the scenarios start, by name. Each runs
// until it is done or its context ends (SIGTERM, or stdin closed: the test
// is gone) and returns an error to exit with status 1.
var roles = map[string]func(ctx context.Context, args []string) error{}

// helperMain runs the role roleEnv names, if any, and exits; it returns
// false when this process is the test binary proper.
func helperMain() bool {
	name := os.Getenv(roleEnv)
	if name == "" {
		return false
	}
	run, ok := roles[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "faulttest: unknown role %q\n", name)
		os.Exit(2)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, nil)).With("role", name, "pid", os.Getpid()))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	go func() {
		var b [1]byte
		for {
			if _, err := os.Stdin.Read(b[:]); err != nil {
				stop()
				return
			}
		}
	}()
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		slog.Error("helper failed", "err", err)
		os.Exit(1)
	}
	os.Exit(0)
	return true
}
