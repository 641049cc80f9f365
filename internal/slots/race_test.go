//go:build race

package slots

// raceEnabled: the tests run under the race detector, whose atomics run in
// its C runtime, where a fault cannot become a Go panic
// (debug.SetPanicOnFault): the process dies instead.
const raceEnabled = true
