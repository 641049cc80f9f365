package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// nodeBArg is the hidden first argument with which rpcfill re-executes
// itself as node B.
const nodeBArg = "-rpcfill-node-b"

// listening starts the line node B prints on stdout once it listens.
const listening = "listening on "

// runNodeB is node B's main: it reads the token from the first line of its
// standard input, serves root on a free loopback port with rpc.NewServer and
// Serve (the built-in fill, read and describe services are all rpcfill
// needs), prints "listening on HOST:PORT", and stops when its standard
// input ends (node A closed it, or died) or on SIGTERM. It returns the exit
// status.
func runNodeB(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", "B")
	if len(args) != 1 {
		log.Error("usage: rpcfill " + nodeBArg + " ROOT, with the token on stdin")
		return 2
	}
	signal.Ignore(os.Interrupt) // Ctrl-C reaches node A, which stops node B
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	token := bytes.TrimRight([]byte(line), "\r\n")
	if err != nil || len(token) == 0 {
		log.Error("no token on stdin", "err", err)
		return 1
	}
	go func() {
		io.Copy(io.Discard, in) // returns when node A closes our stdin
		stop()
	}()

	srv, err := rpc.NewServer(rpc.WithRoot(args[0]), rpc.WithToken(token), rpc.WithLogger(log))
	if err != nil {
		log.Error("server", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		srv.Close()
		log.Error("listen", "err", err)
		return 1
	}
	fmt.Println(listening + ln.Addr().String())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err = <-served:
		log.Error("serve", "err", err)
		srv.Close()
		return 1
	case <-ctx.Done():
	}
	if err := srv.Close(); err != nil {
		log.Error("close", "err", err)
		return 1
	}
	if err := <-served; err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

// nodeB is node B running as a child process.
type nodeB struct {
	addr  string
	cmd   *exec.Cmd
	stdin io.WriteCloser // open while node B should run
	done  chan error     // receives cmd.Wait's result
}

// startNodeB re-executes this program as node B serving root, hands it the
// token, and returns once it listens.
func startNodeB(ctx context.Context, root string, token []byte) (*nodeB, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, nodeBArg, root)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting node B: %w", err)
	}
	b := &nodeB{cmd: cmd, stdin: stdin, done: make(chan error, 1)}
	lines := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		s, _ := br.ReadString('\n')
		lines <- s
		io.Copy(os.Stdout, br) // anything else it prints; EOF when it exits
		b.done <- cmd.Wait()
	}()
	if _, err := fmt.Fprintf(stdin, "%s\n", token); err != nil {
		b.stop()
		return nil, fmt.Errorf("node B: %w", err)
	}
	select {
	case s := <-lines:
		addr, ok := strings.CutPrefix(strings.TrimSpace(s), listening)
		if !ok {
			b.stop()
			return nil, fmt.Errorf("node B printed %q, not its address", s)
		}
		b.addr = addr
		return b, nil
	case <-time.After(10 * time.Second):
		b.stop()
		return nil, errors.New("node B did not listen within 10s")
	case <-ctx.Done():
		b.stop()
		return nil, ctx.Err()
	}
}

func (b *nodeB) pid() int { return b.cmd.Process.Pid }

// stop closes node B's standard input, which stops it, and waits for it to
// exit; it kills it if it has not within 10 s.
func (b *nodeB) stop() error {
	b.stdin.Close()
	select {
	case err := <-b.done:
		if err != nil {
			return fmt.Errorf("node B (pid %d): %w", b.pid(), err)
		}
		return nil
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
		return fmt.Errorf("node B (pid %d) did not stop within 10s; killed", b.pid())
	}
}

// randomToken returns a random 32-byte token, hex-encoded.
func randomToken() []byte {
	b := make([]byte, 32)
	rand.Read(b)
	return []byte(hex.EncodeToString(b))
}

// readToken reads a token file: the file's bytes without trailing newlines.
// Like "tensorwire node", it refuses a file other users may read.
func readToken(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o007 != 0 {
		return nil, fmt.Errorf("token file %s is accessible to other users (mode %#o): chmod o= %s", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	token := bytes.TrimRight(b, "\r\n")
	if len(token) == 0 {
		return nil, fmt.Errorf("token file %s is empty", path)
	}
	return token, nil
}
