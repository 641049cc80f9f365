package benchkit

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMeasureWake(t *testing.T) {
	runtime.LockOSThread() // this thread's affinity is checked below: keep to it
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	w, err := MeasureWake()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wake-up round trip: %v", w)
	if w.Same <= 0 || w.Same > time.Second {
		t.Errorf("Same = %v: want a round trip between 0 and 1 s", w.Same)
	}
	if before.Count() >= 2 && (w.Across <= 0 || w.Across > time.Second) {
		t.Errorf("Across = %v with %d CPUs to run on: want a round trip between 0 and 1 s", w.Across, before.Count())
	}
	if before.Count() < 2 && w.Across != 0 {
		t.Errorf("Across = %v with one CPU to run on: want 0", w.Across)
	}
	var after unix.CPUSet
	if err := unix.SchedGetaffinity(0, &after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("the caller's thread may run on %d CPUs after MeasureWake, %d before: its threads' pinning leaked", after.Count(), before.Count())
	}
	if s := w.String(); !strings.Contains(s, "us") {
		t.Errorf("String() = %q: want microseconds", s)
	}
}

// A side that cannot be pinned fails the measurement with its error, and
// the other side, blocked in a read, is released instead of waiting forever.
func TestPingPong_PinFails(t *testing.T) {
	const nowhere = 1 << 14 // no machine has this CPU: sched_setaffinity refuses it
	for _, tc := range []struct {
		name string
		a, b int
	}{
		{"echo's CPU", 0, nowhere},
		{"timer's CPU", nowhere, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() {
				_, err := pingPong(tc.a, tc.b, 100)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil || !strings.Contains(err.Error(), "sched_setaffinity") {
					t.Errorf("pingPong = %v: want the pinning's error", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("pingPong still waits 10 s after a side failed to pin")
			}
		})
	}
}
