//go:build !linux

package serve

import "time"

// sleepFor sleeps d (time.Sleep: the fake model's cost is less exact off
// Linux).
func sleepFor(d time.Duration) { time.Sleep(d) }
