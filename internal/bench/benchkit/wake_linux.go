package benchkit

import (
	"cmp"
	"fmt"
	"runtime"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/report"
	"golang.org/x/sys/unix"
)

// MeasureWake measures Wake: wakeRounds round trips with the two threads
// pinned to the first two CPUs this process may run on, then as many with
// both pinned to the first. Each thread is a goroutine locked to a thread
// of its own that exits locked, so the pinned threads end with it and no
// other goroutine ever runs with their affinity. It takes a fraction of a
// second; run it while the machine is otherwise as it will be for the
// figures it goes with.
func MeasureWake() (Wake, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return Wake{}, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var cpus []int
	for c := 0; c < len(set)*64 && len(cpus) < 2; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) == 0 {
		return Wake{}, fmt.Errorf("sched_getaffinity: no CPU to run on")
	}
	var w Wake
	var err error
	if len(cpus) == 2 {
		if w.Across, err = pingPong(cpus[0], cpus[1], wakeRounds); err != nil {
			return Wake{}, err
		}
	}
	if w.Same, err = pingPong(cpus[0], cpus[0], wakeRounds); err != nil {
		return Wake{}, err
	}
	return w, nil
}

// pingPong returns the p50 of n timed round trips of a byte between a
// thread on CPU a (which times them) and one on CPU b, over two pipes.
// Each side closes the write end it owns when it returns, so the other's
// read ends at EOF if one fails; the read ends are closed once both have
// returned.
func pingPong(a, b, n int) (time.Duration, error) {
	var there, back [2]int
	if err := unix.Pipe2(there[:], unix.O_CLOEXEC); err != nil {
		return 0, fmt.Errorf("pipe: %w", err)
	}
	if err := unix.Pipe2(back[:], unix.O_CLOEXEC); err != nil {
		unix.Close(there[0])
		unix.Close(there[1])
		return 0, fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(there[0])
	defer unix.Close(back[0])
	warm := n / 10
	echoed := make(chan error, 1)
	var ts []time.Duration
	timed := make(chan error, 1)
	go func() { // exits locked: its pinned thread goes with it
		runtime.LockOSThread()
		defer unix.Close(back[1])
		echoed <- echo(b, there[0], back[1], warm+n)
	}()
	go func() { // likewise
		runtime.LockOSThread()
		defer unix.Close(there[1])
		var err error
		ts, err = ping(a, there[1], back[0], warm, n)
		timed <- err
	}()
	errT, errE := <-timed, <-echoed
	if err := cmp.Or(errE, errT); err != nil {
		return 0, err
	}
	return report.Percentile(ts, 50), nil
}

// pin sets the calling thread's affinity to cpu alone.
func pin(cpu int) error {
	var s unix.CPUSet
	s.Set(cpu)
	if err := unix.SchedSetaffinity(0, &s); err != nil {
		return fmt.Errorf("sched_setaffinity to CPU %d: %w", cpu, err)
	}
	return nil
}

// echo, on CPU cpu, reads a byte from in and writes it to out, rounds
// times; it stops early at in's EOF (the timer gave up).
func echo(cpu, in, out, rounds int) error {
	if err := pin(cpu); err != nil {
		return err
	}
	b := []byte{0}
	for range rounds {
		k, err := unix.Read(in, b)
		if err != nil {
			return fmt.Errorf("pipe read: %w", err)
		}
		if k == 0 {
			return nil
		}
		if _, err := unix.Write(out, b); err != nil {
			return fmt.Errorf("pipe write: %w", err)
		}
	}
	return nil
}

// ping, on CPU cpu, sends a byte to out and waits for it on in, warm
// times untimed and then n times timed.
func ping(cpu, out, in, warm, n int) ([]time.Duration, error) {
	if err := pin(cpu); err != nil {
		return nil, err
	}
	b := []byte{1}
	ts := make([]time.Duration, 0, n)
	for i := range warm + n {
		start := time.Now()
		if _, err := unix.Write(out, b); err != nil {
			return nil, fmt.Errorf("pipe write: %w", err)
		}
		if k, err := unix.Read(in, b); err != nil || k != 1 {
			return nil, fmt.Errorf("pipe read: %d bytes, %v", k, err)
		}
		if i >= warm {
			ts = append(ts, time.Since(start))
		}
	}
	return ts, nil
}
