package rpc

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

// Each system's server runs in its own child process, this same program
// re-executed by nodeproc.Spawn as
//
//	PROGRAM SELF... --serve NAME --listen 127.0.0.1:0
//
// where SELF are bench.Env.Self, the arguments that run this benchmark.
// The child listens, prints "listening on HOST:PORT" on stdout, and serves
// until SIGTERM (nodeproc.Proc.Stop) or until its stdin reaches end of file
// (the parent is gone). Its stderr is the parent's.

// startChild starts the server of the named system in a child process and
// returns once it listens.
func startChild(ctx context.Context, cfg config, name string) (*nodeproc.Proc, error) {
	return nodeproc.Spawn(ctx, nodeproc.Child{
		Name:   "the " + name + " server",
		Args:   slices.Concat(cfg.self, []string{"--serve", name, "--listen", "127.0.0.1:0"}),
		Stderr: cfg.stderr,
	})
}

// serveChild is the child's main: it serves the named system on listen,
// after printing its address to stdout, until ChildContext ends.
func serveChild(name, listen string, stdout io.Writer) error {
	sys, ok := registry[name]
	if !ok {
		return bench.Usagef("--serve: no system %q", name)
	}
	ctx, stop := nodeproc.ChildContext()
	defer stop()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdout, nodeproc.ListeningPrefix+ln.Addr().String()); err != nil {
		ln.Close()
		return fmt.Errorf("printing the address: %w", err)
	}
	if err := sys.serve(ctx, ln); err != nil {
		return fmt.Errorf("the %s server (pid %d): %w", name, os.Getpid(), err)
	}
	return nil
}
