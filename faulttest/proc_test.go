package faulttest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a process a scenario started (a node, a writer, a trainer),
// usually inside a host's namespace. Its stdout is read line by line:
// every line is kept, and the latest line with each "key " prefix can be
// asked for (last), so helpers report progress as "stat ..." lines. Its
// stdin is a pipe held open until the process is stopped, so helpers of
// this binary notice a test that died (helperMain). Whatever happens, it is
// killed and waited for when the test ends, and its stderr is logged if the
// test failed.
type proc struct {
	name string
	cmd  *exec.Cmd

	stdin  io.WriteCloser
	stderr lockedBuffer
	exited chan struct{} // closed once the process has exited and its output is read

	mu    sync.Mutex
	lines []string
	cond  *sync.Cond
	err   error // cmd.Wait's, once exited
}

// startProc starts cmd (from netns.Host.Command or exec.Command) as name.
func startProc(t testing.TB, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{})}
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
		p.kill()
		if t.Failed() {
			t.Logf("%s (pid %d) stderr:\n%s", name, p.pid(), tail(p.stderr.String(), 4000))
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
		p.mu.Unlock()
		close(p.exited)
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// expect waits up to d for a line starting with prefix (from the start of
// the output) and returns the rest of it, trimmed.
func (p *proc) expect(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	rest, err := p.waitLine(prefix, d)
	if err != nil {
		t.Fatalf("%s: %v; stderr:\n%s", p.name, err, tail(p.stderr.String(), 4000))
	}
	return rest
}

func (p *proc) waitLine(prefix string, d time.Duration) (string, error) {
	timer := time.AfterFunc(d, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer timer.Stop()
	deadline := time.Now().Add(d)
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; ; {
		for ; i < len(p.lines); i++ {
			if rest, ok := strings.CutPrefix(p.lines[i], prefix); ok {
				return strings.TrimSpace(rest), nil
			}
		}
		select {
		case <-p.exited:
			return "", fmt.Errorf("exited (%v) before printing %q", p.err, prefix)
		default:
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("did not print %q within %v", prefix, d)
		}
		p.cond.Wait()
	}
}

// last returns the rest of the latest line starting with prefix, or "".
func (p *proc) last(prefix string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(p.lines[i], prefix); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// alive reports whether the process has not exited.
func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (p *proc) kill() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	p.stdin.Close()
}

// stop sends SIGTERM and waits up to d for a clean exit; it returns the
// exit error (nil for status 0), killing the process if it does not stop.
func (p *proc) stop(d time.Duration) error {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("%s did not stop within %v of SIGTERM; killed", p.name, d)
	}
	p.stdin.Close()
	return p.exitErr()
}

// wait waits up to d for the process to exit by itself.
func (p *proc) wait(d time.Duration) error {
	select {
	case <-p.exited:
	case <-time.After(d):
		p.kill()
		return fmt.Errorf("%s did not exit within %v; killed", p.name, d)
	}
	return p.exitErr()
}

// exitErr returns how the process exited (cmd.Wait's error), or nil while
// it runs.
func (p *proc) exitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// output returns everything the process printed on stdout so far.
func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(b)
}

func (l *lockedBuffer) String() string {
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
