package serve

import (
	"syscall"
	"time"
)

// sleepFor sleeps d with nanosleep(2): the thread blocks in the kernel and
// wakes within tens of microseconds of d, where time.Sleep, which waits in
// the runtime's poller, may wake up to a millisecond late. It uses no CPU.
func sleepFor(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
