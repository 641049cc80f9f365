package serve

import (
	"fmt"
	"time"
)

// Policy is when a free replica closes the batch it takes: the Manager
// asks it when a free replica finds an open batch that holds a request
// and is not full, and the replica waits as long as it says, or until a
// request joins the batch, then asks again (a full batch is taken at
// once). Greedy and MaxDelay are the policies this package has; a new one
// is a type with a Wait method (policy.go).
type Policy interface {
	// Wait returns how much longer a free replica waits for more requests
	// before it takes the open batch, whose first request was queued at
	// first and which holds rows of at most max rows (rows < max); 0 or
	// less: it takes the batch now. It is called with the Manager's lock
	// held, so it must be quick and must not call the Manager.
	Wait(first time.Time, rows, max int) time.Duration
}

// Greedy is torch_spread's batching policy: a free replica blocks for a
// first request, then takes every request queued that fits, in order,
// without waiting for more. The request that would overflow the batch is
// carried over to the next, whole, and so are those behind it.
func Greedy() Policy { return greedy{} }

// MaxDelay is Greedy, except that a free replica whose batch is not full
// waits for more requests until d has passed since its first request was
// queued (Triton's max_queue_delay, Ray Serve's batch_wait_timeout_s). It
// trades latency at low load for larger batches. d <= 0 is Greedy.
func MaxDelay(d time.Duration) Policy {
	if d <= 0 {
		return greedy{}
	}
	return maxDelay(d)
}

type greedy struct{}

func (greedy) Wait(time.Time, int, int) time.Duration { return 0 }

// String returns "greedy".
func (greedy) String() string { return "greedy" }

type maxDelay time.Duration

func (d maxDelay) Wait(first time.Time, _, _ int) time.Duration {
	return time.Until(first.Add(time.Duration(d)))
}

// String returns "max_delay=D".
func (d maxDelay) String() string { return fmt.Sprintf("max_delay=%v", time.Duration(d)) }

// policyName is p as serve's info message and the logs spell it.
func policyName(p Policy) string {
	if p == nil {
		p = Greedy()
	}
	return fmt.Sprint(p)
}
