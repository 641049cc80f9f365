//go:build !race

package collective

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
