//go:build soak

package faulttest

import "time"

// The soak mode: go test -tags soak -timeout 2h ./faulttest/ runs each
// scenario for minutes, with many more faults. Not run in CI.
func init() {
	load = loadSettings{
		Name:        "soak",
		Run:         3 * time.Minute,
		WriterPace:  5 * time.Millisecond,
		KillEvery:   [2]time.Duration{100 * time.Millisecond, 2 * time.Second},
		NodeKills:   20,
		Partitions:  10,
		Partition:   6 * time.Second,
		HostileRuns: 20,
	}
}
