package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

// Each system's server runs in its own child process, this same program
// re-executed by nodeproc.Spawn as
//
//	PROGRAM --serve NAME --listen 127.0.0.1:0
//
// The child listens, prints "listening on HOST:PORT" on stdout, and serves
// until SIGTERM (nodeproc.Proc.Stop) or until its stdin reaches end of file
// (the parent is gone). Its stderr is the parent's.

// startChild starts the server of the named system in a child process and
// returns once it listens.
func startChild(ctx context.Context, name string) (*nodeproc.Proc, error) {
	return nodeproc.Spawn(ctx, nodeproc.Child{
		Name: "the " + name + " server",
		Args: []string{"--serve", name, "--listen", "127.0.0.1:0"},
	})
}

// serveChild is the child's main: it serves the named system on listen and
// returns the exit status.
func serveChild(name, listen string) int {
	log := slog.With("server", name, "pid", os.Getpid())
	sys, ok := registry[name]
	if !ok {
		log.Error("no such system")
		return 2
	}
	ctx, stop := nodeproc.ChildContext()
	defer stop()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	if _, err := fmt.Println(nodeproc.ListeningPrefix + ln.Addr().String()); err != nil {
		log.Error("printing the address", "err", err)
		return 1
	}
	if err := sys.serve(ctx, ln); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}
