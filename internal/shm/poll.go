package shm

import (
	"sync"
	"time"
)

// The polling fallback of Wait and Wake, for systems without futexes (and
// tested on Linux too): a waiter reads the word at growing intervals, from
// pollFirst to pollMax, so a change by another process is seen within
// pollMax; a Wake in this process ends every poller's sleep at once.

const (
	pollFirst = 20 * time.Microsecond
	pollMax   = time.Millisecond
)

// wakeups is closed and replaced by each pollWake: the pollers of this
// process select on it. One channel for every word: a Wake on one word
// wakes the pollers of all, which Wait allows (an early return).
var wakeups struct {
	mu sync.Mutex
	ch chan struct{}
}

func wakeupChan() <-chan struct{} {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	if wakeups.ch == nil {
		wakeups.ch = make(chan struct{})
	}
	return wakeups.ch
}

func pollWake() {
	wakeups.mu.Lock()
	defer wakeups.mu.Unlock()
	if wakeups.ch != nil {
		close(wakeups.ch)
		wakeups.ch = nil
	}
}

func pollWait(w *Uint32, old uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	woken := wakeupChan() // before the first read: a Wake after it is not lost
	deadline := time.Now().Add(d)
	step := pollFirst
	var t *time.Timer
	for w.Load() == old {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		if t == nil {
			t = time.NewTimer(min(step, left))
			defer t.Stop()
		} else {
			t.Reset(min(step, left))
		}
		select {
		case <-woken:
			return
		case <-t.C:
		}
		step = min(2*step, pollMax)
	}
}
