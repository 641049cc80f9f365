//go:build unix

package benchkit

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestOnInterrupt_CancelsOnSignal(t *testing.T) {
	ctx, stop := OnInterrupt(context.Background())
	defer stop()
	if err := unix.Kill(os.Getpid(), unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("SIGTERM did not cancel the context in 30 s")
	}
	if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) || !strings.Contains(cause.Error(), "terminated") {
		t.Errorf("cause %v does not name the signal", cause)
	}

	ctx2, stop2 := OnInterrupt(context.Background())
	stop2()
	if ctx2.Err() == nil {
		t.Error("stop did not cancel the context")
	}
	parent, cancel := context.WithCancel(context.Background())
	ctx3, stop3 := OnInterrupt(parent)
	defer stop3()
	cancel()
	if ctx3.Err() == nil {
		t.Error("cancelling the parent did not cancel the context")
	}
}

// TestOnInterrupt_SecondSignalEnds runs a process that waits for its
// context, then signals itself again: the second SIGTERM must end it.
func TestOnInterrupt_SecondSignalEnds(t *testing.T) {
	if os.Getenv("BENCHKIT_HELPER") == "interrupt" {
		ctx, stop := OnInterrupt(context.Background())
		defer stop()
		unix.Kill(os.Getpid(), unix.SIGTERM)
		<-ctx.Done()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			unix.Kill(os.Getpid(), unix.SIGTERM) // until the default action ends this process
		}
		os.Exit(0) // the second signal was caught: the parent sees status 0
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOnInterrupt_SecondSignalEnds$")
	cmd.Env = append(os.Environ(), "BENCHKIT_HELPER=interrupt")
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("the helper exited with %v, want death by SIGTERM", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the helper ended with %v, want death by SIGTERM", err)
	}
}
