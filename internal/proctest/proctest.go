// Package proctest runs a test binary again as a helper process, for tests
// whose peer must be a real process: one that can be killed with SIGKILL
// in the middle of a call.
//
// The helper is the same test binary run with -test.run=^TestHelperProcess$
// and an environment that says what to be; the package under test has a
// TestHelperProcess that reads it, does the job, and skips when it is not
// set. A helper talks to its test through its standard output, line by line
// (Expect).
package proctest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Proc is a running helper process.
type Proc struct {
	cmd    *exec.Cmd
	lines  chan string // its standard output, line by line
	stderr LockedBuffer

	waitOnce sync.Once
	waitErr  error
}

// Start runs the test binary again as a helper with env added (NAME=value
// pairs, which tell it what to be). It is killed and waited for when the
// test ends, whatever happens; its stderr is logged if the test failed.
func Start(t testing.TB, env ...string) *Proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	p := &Proc{cmd: cmd, lines: make(chan string, 64)}
	cmd.Stderr = &p.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("helper %v stderr:\n%s", env, p.Stderr())
		}
	})
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	return p
}

// Expect waits up to 30 s for a line of output that starts with prefix and
// returns the rest of it, trimmed; it fails the test if the helper exits or
// the time runs out first.
func (p *Proc) Expect(t testing.TB, prefix string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatalf("helper exited (%v) before printing %q; stderr:\n%s", p.Wait(), prefix, p.Stderr())
			}
			if rest, found := strings.CutPrefix(line, prefix); found {
				return strings.TrimSpace(rest)
			}
		case <-timeout:
			t.Fatalf("helper did not print %q within 30 s", prefix)
		}
	}
}

// Pid returns the helper's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL, waits for the process to be gone, and returns when it
// was killed.
func (p *Proc) Kill() time.Time {
	p.cmd.Process.Signal(syscall.SIGKILL)
	at := time.Now()
	p.Wait()
	return at
}

// Wait waits for the helper to exit and returns cmd.Wait's error.
func (p *Proc) Wait() error {
	p.waitOnce.Do(func() { p.waitErr = p.cmd.Wait() })
	return p.waitErr
}

// Stderr returns what the helper wrote to its standard error so far.
func (p *Proc) Stderr() string { return p.stderr.String() }

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
