//go:build !race

package loader

// raceEnabled: the tests run under the race detector.
const raceEnabled = false
