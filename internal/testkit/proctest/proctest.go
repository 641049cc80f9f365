// Package proctest runs processes for tests whose peer must be a real
// process: one that can be killed with SIGKILL in the middle of a call, or
// run inside another network namespace.
//
// Start runs the test binary again as a helper: the same binary run with
// -test.run=^TestHelperProcess$ and an environment that says what to be;
// the package under test has a TestHelperProcess that reads it, does the
// job, and skips when it is not set. StartCmd runs any command. Either way
// the process talks to its test through its standard output, line by line
// (Expect, Line, Last, Output).
//
// When a test fails, every process it started is killed and its stderr
// logged; one still running is first asked for its goroutines' stacks
// (Dump), so a test that failed because a Go process waited for ever shows
// where it waited.
package proctest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// expectTimeout is how long Expect waits for its line.
const expectTimeout = 30 * time.Second

// dumpWait is how long a failed test's cleanup waits for a process to write
// its stacks and exit (Dump); dumpTail is how much of a dumped process's
// stderr the test's log gets, where it gets 4000 bytes of the others'.
const (
	dumpWait = 5 * time.Second
	dumpTail = 64 << 10
)

// Proc is a running process started by Start or StartCmd. Every line of its
// standard output is kept. Its standard input is a pipe held open until it
// is stopped or killed, so a helper can notice its test is gone (end of
// file). Its methods are safe for concurrent use.
type Proc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr LockedBuffer
	exited chan struct{} // closed once it has exited and its output is read

	mu     sync.Mutex
	cond   *sync.Cond // signalled on every line, and on exit
	lines  []string
	cursor int   // lines before it were consumed by Expect or Line
	err    error // cmd.Wait's, once exited
}

// Start runs the test binary again as a helper with env added (NAME=value
// pairs, which tell it what to be), as StartCmd does.
func Start(t testing.TB, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	return StartCmd(t, fmt.Sprintf("helper %v", env), cmd)
}

// StartCmd starts cmd, named name in messages. It is killed and waited for
// when the test ends, whatever happens, and its stderr is logged if the
// test failed. cmd's Stdin, Stdout and Stderr must be unset.
func StartCmd(t testing.TB, name string, cmd *exec.Cmd) *Proc {
	t.Helper()
	p := &Proc{name: name, cmd: cmd, exited: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() && p.Alive() {
			t.Logf("%s (pid %d) was still running; its stacks (SIGQUIT) and stderr:\n%s", name, p.Pid(),
				tail(p.Dump(dumpWait), dumpTail))
			return
		}
		p.Kill()
		if t.Failed() {
			t.Logf("%s (pid %d) stderr:\n%s", name, p.Pid(), tail(p.Stderr(), 4000))
		}
	})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		err := cmd.Wait()
		p.mu.Lock()
		p.err = err
		close(p.exited)
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p
}

// Name returns the name the process was started with.
func (p *Proc) Name() string { return p.name }

// Pid returns the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Expect waits up to 30 s for the next line of output, after those Expect
// and Line already returned, that starts with prefix, and returns the rest
// of it, trimmed; it fails the test if the process exits or the time runs
// out first.
func (p *Proc) Expect(t testing.TB, prefix string) string {
	t.Helper()
	rest, err := p.Line(prefix, expectTimeout)
	if err != nil {
		t.Fatalf("%s: %v; stderr:\n%s", p.name, err, tail(p.Stderr(), 4000))
	}
	return rest
}

// Line is Expect with a time limit of d, returning an error where Expect
// fails the test.
func (p *Proc) Line(prefix string, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	timer := time.AfterFunc(d, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for {
		for ; p.cursor < len(p.lines); p.cursor++ {
			if rest, ok := strings.CutPrefix(p.lines[p.cursor], prefix); ok {
				p.cursor++
				return strings.TrimSpace(rest), nil
			}
		}
		select {
		case <-p.exited:
			return "", fmt.Errorf("exited (%v) before printing %q", p.err, prefix)
		default:
		}
		if !time.Now().Before(deadline) {
			return "", fmt.Errorf("did not print %q within %v", prefix, d)
		}
		p.cond.Wait()
	}
}

// Last returns the rest of the latest line starting with prefix, or "".
func (p *Proc) Last(prefix string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(p.lines[i], prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// Output returns every line printed on stdout so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// Stderr returns what the process wrote to its standard error so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

// Alive reports whether the process has not exited.
func (p *Proc) Alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// ExitErr returns how the process exited (cmd.Wait's error), or nil while
// it runs.
func (p *Proc) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Kill sends SIGKILL, waits for the process to be gone, and returns when it
// was killed.
func (p *Proc) Kill() time.Time {
	p.cmd.Process.Signal(syscall.SIGKILL)
	at := time.Now()
	<-p.exited
	p.stdin.Close()
	return at
}

// Dump asks the process for the stacks of its goroutines and returns its
// stderr once it has exited: it sends SIGQUIT, on which the Go runtime
// writes every goroutine's stack to stderr and exits with status 2, waits up
// to d for that, and kills the process if it has not exited by then. A
// process that has already exited is not signalled. For a process that is
// not a Go program (or that handles SIGQUIT itself) it is Kill with a grace
// period; either way the process is gone when Dump returns.
func (p *Proc) Dump(d time.Duration) string {
	if p.Alive() {
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-p.exited:
		case <-time.After(d):
		}
	}
	p.Kill()
	return p.Stderr()
}

// WaitFor waits up to d for the process to exit by itself and returns
// cmd.Wait's error; after d it kills the process and returns an error
// saying so.
func (p *Proc) WaitFor(d time.Duration) error {
	select {
	case <-p.exited:
		return p.ExitErr()
	case <-time.After(d):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v; killed", p.name, d)
	}
}

// Stop sends SIGTERM and waits up to d for the process to exit, killing it
// if it does not; it returns how it exited (nil for status 0).
func (p *Proc) Stop(d time.Duration) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(d):
		p.Kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.name, d)
	}
	p.stdin.Close()
	return p.ExitErr()
}

// LockedBuffer is a bytes.Buffer that a process (or goroutine) may write
// while a test reads it: what a child process's stderr goes to.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
