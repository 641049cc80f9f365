package nodeproc

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
)

// ChildArg is the hidden first argument with which Start re-executes the
// program as a node; MaybeRunChild recognises it.
const ChildArg = "-tensorwire-nodeproc-child"

// startTimeout bounds how long a child may take to print its address, and
// stopTimeout how long it may take to stop after SIGTERM.
const (
	startTimeout = 10 * time.Second
	stopTimeout  = 10 * time.Second
)

// ListeningPrefix starts the line a node prints on stdout once it listens:
// "listening on HOST:PORT".
const ListeningPrefix = "listening on "

// MaybeRunChild returns at once unless this process was started by Start.
// If it was, it runs the node the arguments describe, with register (nil
// for none) adding methods to its server, prints "listening on HOST:PORT"
// to stdout, and exits the process when the node stops: status 0 after a
// clean stop, 1 on error. The node stops on SIGTERM or when its standard
// input reaches end of file (the parent is gone); it ignores SIGINT, which
// a terminal's Ctrl-C sends to the whole process group: the parent decides.
//
// Programs that call Start call MaybeRunChild first thing in main, before
// flag.Parse.
func MaybeRunChild(register func(*rpc.Server) error) {
	if len(os.Args) < 2 || os.Args[1] != ChildArg {
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("node", "child")
	fs := flag.NewFlagSet("node", flag.ContinueOnError)
	cfg := Config{Log: log, Register: register}
	fs.StringVar(&cfg.Listen, "listen", "127.0.0.1:0", "")
	fs.StringVar(&cfg.Root, "root", "", "")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "")
	if err := fs.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	signal.Ignore(os.Interrupt)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	err := Run(ctx, cfg, func(addr string) { fmt.Println(ListeningPrefix + addr) })
	if err != nil {
		log.Error("node failed", "err", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// Options configures Start.
type Options struct {
	Root      string // the node's shared root
	TokenFile string // the shared secret; "" makes a random one (Proc.Token)
}

// Proc is a node running in a child process, started by Start.
type Proc struct {
	Addr  string // where it listens, on loopback
	Token []byte // the shared secret: dial with rpc.WithToken(Token)

	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{} // closed when the child has exited; then err is set
	err   error
}

// Start re-executes the running program (os.Executable) as a node serving
// o.Root on a free loopback port, and returns once it listens. The program
// must call MaybeRunChild at the start of main. The child's logs go to this
// process's stderr. Stop it with Stop; if this process dies first, the
// child stops by itself.
func Start(ctx context.Context, o Options) (p *Proc, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	p = &Proc{done: make(chan struct{})}
	tokenFile := o.TokenFile
	if tokenFile == "" {
		dir, err := os.MkdirTemp("", "tensorwire-token-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir) // the child has read it once it listens
		if tokenFile, err = writeRandomToken(filepath.Join(dir, "token")); err != nil {
			return nil, err
		}
	}
	if p.Token, err = ReadToken(tokenFile); err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, ChildArg, "--listen", "127.0.0.1:0", "--root", o.Root, "--token-file", tokenFile)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	if p.stdin, err = cmd.StdinPipe(); err != nil { // held open until Stop
		r.Close()
		w.Close()
		return nil, err
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("starting node B: %w", err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	defer func() {
		if err != nil {
			p.Stop()
		}
	}()

	line := make(chan string, 1)
	go func() {
		defer r.Close()
		br := bufio.NewReader(r)
		s, _ := br.ReadString('\n') // fails once the child is gone
		line <- s
		io.Copy(os.Stderr, br) // anything else it prints, until it exits
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s := <-line:
		addr, ok := strings.CutPrefix(strings.TrimSpace(s), ListeningPrefix)
		if s == "" {
			<-p.done
			return nil, fmt.Errorf("node B exited before listening: %v", p.err)
		}
		if !ok {
			return nil, fmt.Errorf("node B printed %q, not its address", s)
		}
		p.Addr = addr
		return p, nil
	case <-timer.C:
		return nil, fmt.Errorf("node B did not listen within %v", startTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// writeRandomToken writes a random 32-byte token, hex-encoded, to a new
// file at path readable by its owner only, and returns path.
func writeRandomToken(path string) (string, error) {
	b := make([]byte, 32)
	rand.Read(b)
	if err := os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// Pid returns the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stop asks the child to stop (SIGTERM), waits for it, and kills it if it
// has not stopped within ten seconds. It returns an error unless the child
// exited with status 0. Calling it again returns the same result.
func (p *Proc) Stop() error {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			p.cmd.Process.Kill()
			<-p.done
			p.stdin.Close()
			return fmt.Errorf("node B (pid %d) did not stop within %v of SIGTERM; killed", p.Pid(), stopTimeout)
		}
	}
	p.stdin.Close()
	if p.err != nil {
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			return fmt.Errorf("node B (pid %d): %v", p.Pid(), ee)
		}
		return fmt.Errorf("node B (pid %d): %w", p.Pid(), p.err)
	}
	return nil
}
