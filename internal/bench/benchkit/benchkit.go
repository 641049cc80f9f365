// Package benchkit holds what the benchmarks (the programs under benchmarks/
// and the testing.B benchmarks of memmap and tensordict) need to measure
// copies fairly side by side: random distinct rows, buffers whose pages are
// already touched, a way to evict the CPU caches between timed operations,
// (pages_linux.go) a way to make a file that several processes map cold,
// (cpu_unix.go) a process's CPU time, (loopback.go) what a byte costs
// through loopback TCP, and (interrupt.go) the Ctrl-C handling that lets a
// program remove its dataset.
package benchkit

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
)

// PickRows fills rows with distinct random indices in [0, n); n must be at
// least len(rows).
func PickRows(rng *rand.Rand, n int, rows []int) {
	for i := range rows {
	again:
		rows[i] = rng.IntN(n)
		for _, r := range rows[:i] {
			if r == rows[i] {
				goto again
			}
		}
	}
}

// Fill sets every byte of b to v, doubling the copied prefix.
func Fill(b []byte, v byte) {
	if len(b) == 0 {
		return
	}
	b[0] = v
	for n := 1; n < len(b); n *= 2 {
		copy(b[n:], b[:n])
	}
}

// Touched returns a Go-heap buffer of n bytes with every page written, so
// that timing a copy into or out of it measures no page faults.
func Touched(n int) []byte {
	b := make([]byte, n)
	Fill(b, 0x5a)
	return b
}

// CacheFlushBytes is how much FlushCache should read: several times the
// last-level cache of the machines this project runs on.
const CacheFlushBytes = 128 << 20

// FlushCache reads one byte of every cache line of b (CacheFlushBytes long,
// say), evicting what the CPU caches held before, as after any real work.
func FlushCache(b []byte) {
	var x byte
	for i := 0; i < len(b); i += 64 {
		x += b[i]
	}
	runtime.KeepAlive(x) // the loads must happen: x is used
}

// ErrMismatch is wrapped by CheckRow's errors: data a benchmark verified
// was not what it had written.
var ErrMismatch = errors.New("bytes differ from what was written")

// CheckRow returns nil if every byte of row, row r of the data, is want,
// and otherwise an error wrapping ErrMismatch that names the first byte
// that differs.
func CheckRow(r int, row []byte, want byte) error {
	if bytes.Count(row, []byte{want}) == len(row) { // vectorized: the common case
		return nil
	}
	i := 0
	for row[i] == want {
		i++
	}
	return fmt.Errorf("%w: row %d byte %d is %d, want %d", ErrMismatch, r, i, row[i], want)
}
