package benchkit

import (
	"context"
	"fmt"
	"net"
	"time"
)

// Loopback is what moving bytes through one loopback TCP connection costs
// on this machine: the wall-clock rate of one stream, and the CPU time of
// a byte, its sender's write and its receiver's read together. Collectives
// over TCP on one host send every byte they move this way, so
// CPUNsPerByte bounds them: p ranks on c cores that each send and receive
// V bytes cannot finish in less than p·V·CPUNsPerByte / min(p, c)
// nanoseconds, whatever the algorithm, before any arithmetic.
type Loopback struct {
	GBps         float64 `json:"GBps"`            // one stream, wall clock (1e9 bytes a second)
	CPUNsPerByte float64 `json:"cpu_ns_per_byte"` // sender and receiver together
}

// loopbackBytes and loopbackWrite: 64 MiB a round in writes of 1 MiB, as the
// TCP collectives send their pieces; loopbackRounds rounds after one warm-up.
const (
	loopbackBytes  = 64 << 20
	loopbackWrite  = 1 << 20
	loopbackRounds = 5
)

// MeasureLoopback measures Loopback: a connection to a listener on
// 127.0.0.1 in this process, one goroutine writing 64 MiB in 1 MiB writes
// of one buffer and another reading it into a 1 MiB buffer, a warm-up
// round and then five timed ones. Both buffers stay in the caches, so the
// cost is the path's alone, a floor under what a collective's tensors,
// read from and written to memory, cost. The CPU time is the process's (ProcessCPU), so the
// rest of the process should be idle meanwhile; it is an error where the
// CPU time cannot be read.
func MeasureLoopback(ctx context.Context) (Loopback, error) {
	if ProcessCPU() < 0 {
		return Loopback{}, fmt.Errorf("loopback cost: no CPU time on this system")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return Loopback{}, fmt.Errorf("loopback cost: %w", err)
	}
	defer ln.Close()
	// The reader says when it has read the warm-up round, so that the
	// timed rounds' CPU holds no reading of it.
	got, warm := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(warm) // also on an error: the writer then fails too
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		buf := make([]byte, loopbackWrite)
		read := func(left int) error {
			for left > 0 {
				n, err := c.Read(buf[:min(len(buf), left)])
				if err != nil {
					return err
				}
				left -= n
			}
			return nil
		}
		if err := read(loopbackBytes); err != nil {
			got <- err
			return
		}
		warm <- struct{}{}
		got <- read(loopbackRounds * loopbackBytes)
	}()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		return Loopback{}, fmt.Errorf("loopback cost: %w", err)
	}
	defer c.Close()
	src := Touched(loopbackWrite)
	send := func() error {
		for off := 0; off < loopbackBytes; off += loopbackWrite {
			if _, err := c.Write(src); err != nil {
				return err
			}
		}
		return nil
	}
	if err := send(); err != nil { // warm-up
		return Loopback{}, fmt.Errorf("loopback cost: %w", err)
	}
	if _, ok := <-warm; !ok {
		return Loopback{}, fmt.Errorf("loopback cost: %w", <-got)
	}
	cpu0, t0 := ProcessCPU(), time.Now()
	for range loopbackRounds {
		if err := send(); err != nil {
			return Loopback{}, fmt.Errorf("loopback cost: %w", err)
		}
	}
	if err := <-got; err != nil {
		return Loopback{}, fmt.Errorf("loopback cost: %w", err)
	}
	wall, cpu := time.Since(t0), ProcessCPU()-cpu0
	n := float64(loopbackRounds * loopbackBytes)
	return Loopback{GBps: n / wall.Seconds() / 1e9, CPUNsPerByte: float64(cpu.Nanoseconds()) / n}, nil
}
