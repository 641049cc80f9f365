package faulttest

import "time"

// loadSettings say how long and how hard the scenarios run.
type loadSettings struct {
	Name        string
	Run         time.Duration // each workload scenario's run under load
	WriterPace  time.Duration // a writer's pause between batches of 32
	KillEvery   [2]time.Duration
	NodeKills   int // kills of the buffer node in its scenario
	Partitions  int // partitions in the partition scenario
	Partition   time.Duration
	HostileRuns int // rounds of every hostile peer
}

// load is the short mode, which CI runs (go test ./...); soak_test.go
// replaces it under the soak build tag.
var load = loadSettings{
	Name:        "short",
	Run:         6 * time.Second,
	WriterPace:  5 * time.Millisecond,
	KillEvery:   [2]time.Duration{150 * time.Millisecond, 900 * time.Millisecond},
	NodeKills:   2,
	Partitions:  1,
	Partition:   4 * time.Second,
	HostileRuns: 1,
}

// capacity returns a buffer capacity that holds everything writers write
// in the run, so that nothing acknowledged may be overwritten.
func (l loadSettings) capacity(writers int) int {
	perWriter := int(l.Run/l.WriterPace+1) * 32
	return 2*writers*perWriter + 4096
}
