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
	"sync"
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
// clean stop, 1 on error. The node stops as ChildContext says: on SIGTERM
// or when its standard input reaches end of file.
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
	ctx, stop := ChildContext()
	defer stop()
	err := Run(ctx, cfg, func(addr string) { fmt.Println(ListeningPrefix + addr) })
	if err != nil {
		log.Error("node failed", "err", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// ChildContext is for the main of a program that Spawn (or Start) runs. It
// ignores SIGINT, which a terminal's Ctrl-C sends to the whole process
// group (the parent decides when its children stop), and returns a context
// that ends on SIGTERM or when standard input reaches end of file (the
// parent is gone).
func ChildContext() (context.Context, context.CancelFunc) {
	signal.Ignore(os.Interrupt)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop()
	}()
	return ctx, stop
}

// Options configures Start.
type Options struct {
	Root      string // the node's shared root
	TokenFile string // the shared secret; "" makes a random one (Proc.Token)
}

// Proc is a server running in a child process, started by Spawn or Start.
type Proc struct {
	Addr  string // where it listens, as it printed it
	Token []byte // Start's node: the shared secret, dial with rpc.WithToken(Token)

	name  string
	cmd   *exec.Cmd
	stdin io.Closer
	done  chan struct{} // closed when the child has exited; then err is set
	err   error

	stopOnce sync.Once
	stopErr  error
}

// Start re-executes the running program (os.Executable) as a node serving
// o.Root on a free loopback port, and returns once it listens. The program
// must call MaybeRunChild at the start of main. The child's logs go to this
// process's stderr. Stop it with Stop; if this process dies first, the
// child stops by itself.
func Start(ctx context.Context, o Options) (*Proc, error) {
	tokenFile := o.TokenFile
	if tokenFile == "" {
		var remove func()
		var err error
		if tokenFile, remove, err = TempToken(); err != nil {
			return nil, err
		}
		defer remove() // the child has read it once it listens
	}
	token, err := ReadToken(tokenFile)
	if err != nil {
		return nil, err
	}
	p, err := Spawn(ctx, Child{
		Name: "node B",
		Args: []string{ChildArg, "--listen", "127.0.0.1:0", "--root", o.Root, "--token-file", tokenFile},
	})
	if err != nil {
		return nil, err
	}
	p.Token = token
	return p, nil
}

// WriteRandomToken writes a random 32-byte token, hex-encoded, to a new
// file at path readable by its owner only: a token file for a node and its
// clients (ReadToken) when they run on one machine. A file already at path
// is an error (fs.ErrExist), left as it was: its mode may let others read it.
func WriteRandomToken(path string) error {
	b := make([]byte, 32)
	rand.Read(b)
	// O_EXCL: a file already there keeps its mode, which may let others
	// read the secret.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(hex.EncodeToString(b) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// TempToken writes a random token (WriteRandomToken) to a file in a new
// temporary folder and returns its path, and remove, which deletes the
// folder: a token for a node and its clients that run on this machine.
func TempToken() (path string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "tensorwire-token-")
	if err != nil {
		return "", nil, err
	}
	path = filepath.Join(dir, "token")
	if err := WriteRandomToken(path); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return path, func() { os.RemoveAll(dir) }, nil
}

// A Child is a server program for Spawn to run. It must print
// "listening on HOST:PORT" (ListeningPrefix and its address) as the first
// line of its stdout once it listens, and exit with status 0 when asked to
// stop with SIGTERM. ChildContext gives it a context that ends then, and
// also when this process dies.
type Child struct {
	Name   string    // how errors name it: "node B"
	Path   string    // the executable; "" re-executes this program (os.Executable)
	Args   []string  // its arguments, without the program name
	Stderr io.Writer // its stderr, and what it prints on stdout after the first line, one Write at a time; nil: os.Stderr
}

// lockedWriter serialises the Writes of a child's two streams.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// Spawn starts c and returns once it has printed its address (Proc.Addr).
// Its standard input is a pipe that stays open until Stop, so it reaches
// end of file if this process dies. Stop it with Stop; on an error Spawn
// stops it itself.
func Spawn(ctx context.Context, c Child) (_ *Proc, err error) {
	path := c.Path
	if path == "" {
		if path, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	var stderr io.Writer = os.Stderr
	if c.Stderr != nil {
		// The child's stderr and the rest of its stdout are copied by two
		// goroutines; a caller's bytes.Buffer must see one Write at a time.
		stderr = &lockedWriter{w: c.Stderr}
	}
	cmd := exec.Command(path, c.Args...)
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, stderr
	p := &Proc{name: c.Name, cmd: cmd, done: make(chan struct{})}
	if p.stdin, err = cmd.StdinPipe(); err != nil { // held open until Stop
		r.Close()
		w.Close()
		return nil, err
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("starting %s: %w", c.Name, err)
	}
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
		io.Copy(stderr, br) // anything else it prints, until it exits
	}()
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s := <-line:
		if s == "" {
			// Its stdout is closed: it exited, or closed or redirected
			// it and runs on, and then ctx and the timeout still hold.
			select {
			case <-p.done:
				return nil, fmt.Errorf("%s exited before listening: %v", c.Name, p.err)
			case <-timer.C:
				return nil, fmt.Errorf("%s closed its stdout and did not listen within %v", c.Name, startTimeout)
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		addr, ok := strings.CutPrefix(strings.TrimSpace(s), ListeningPrefix)
		if !ok {
			return nil, fmt.Errorf("%s printed %q, not its address", c.Name, s)
		}
		p.Addr = addr
		return p, nil
	case <-timer.C:
		return nil, fmt.Errorf("%s did not listen within %v", c.Name, startTimeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Pid returns the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done returns a channel that is closed once the child has exited, however
// it exited, so that a parent can notice a child that died while it waits
// for something else. Stop still says how it exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Stop asks the child to stop (SIGTERM), waits for it, and kills it if it
// has not stopped within ten seconds. It returns an error unless the child
// exited with status 0. Calling it again, also from another goroutine,
// returns the same result.
func (p *Proc) Stop() error {
	p.stopOnce.Do(func() { p.stopErr = p.stop() })
	return p.stopErr
}

func (p *Proc) stop() error {
	defer p.stdin.Close()
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s (pid %d) did not stop within %v of SIGTERM; killed", p.name, p.Pid(), stopTimeout)
		}
	}
	if p.err != nil {
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			return fmt.Errorf("%s (pid %d): %v", p.name, p.Pid(), ee)
		}
		return fmt.Errorf("%s (pid %d): %w", p.name, p.Pid(), p.err)
	}
	return nil
}
