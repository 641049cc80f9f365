package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"time"
)

// Each system's server runs in its own child process, this same program
// re-executed as
//
//	PROGRAM --serve NAME --listen 127.0.0.1:0
//
// The child listens, prints its address on stdout (one line), and serves
// until it is killed or its stdin reaches end of file (the parent is gone).
// Its stderr is the parent's.

// childStartTimeout bounds how long a child may take to print its address.
const childStartTimeout = 10 * time.Second

// A child is a running server process.
type child struct {
	name string
	addr string
	cmd  *exec.Cmd
	out  *os.File      // the read end of its stdout
	done chan struct{} // closed when it has exited; then err is set
	err  error
}

// startChild starts the server of the named system in a child process and
// returns once it listens.
func startChild(ctx context.Context, name string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "--serve", name, "--listen", "127.0.0.1:0")
	cmd.Stdout = w
	cmd.Stderr = os.Stderr
	if _, err := cmd.StdinPipe(); err != nil { // held open until the child exits
		r.Close()
		w.Close()
		return nil, err
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("starting the %s server: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, out: r, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()

	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n') // fails once the child is gone
		line <- s
	}()
	timer := time.NewTimer(childStartTimeout)
	defer timer.Stop()
	select {
	case s := <-line:
		c.addr = strings.TrimSpace(s)
		if _, _, err = net.SplitHostPort(c.addr); err != nil {
			err = fmt.Errorf("the %s server printed %q, not its address", name, s)
		}
	case <-timer.C:
		err = fmt.Errorf("the %s server did not print its address within %v", name, childStartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// kill kills the child without waiting; it may be called at any time, from
// any goroutine, and more than once.
func (c *child) kill() { c.cmd.Process.Kill() }

// stop kills the child and waits for it to exit. It returns an error if the
// child had already failed on its own.
func (c *child) stop() error {
	var err error
	select {
	case <-c.done:
		if c.err != nil {
			err = fmt.Errorf("the %s server exited: %w", c.name, c.err)
		}
	default:
		c.kill()
		<-c.done
	}
	c.out.Close()
	return err
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
	// The parent decides when to stop: it kills us, also on its Ctrl-C,
	// which the terminal sends to us as well.
	signal.Ignore(os.Interrupt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		io.Copy(io.Discard, os.Stdin) // end of file: the parent is gone
		cancel()
	}()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	if _, err := fmt.Println(ln.Addr().String()); err != nil {
		log.Error("printing the address", "err", err)
		return 1
	}
	if err := sys.serve(ctx, ln); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}
