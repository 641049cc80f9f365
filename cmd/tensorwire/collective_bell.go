package main

import (
	"fmt"
	"time"

	"github.com/tensorwire/tensorwire/internal/shm"
)

// The bell: a small file the Python rank and its sidecar both map, with
// two words that say which frame each side has written last, so that the
// side waiting for a frame can watch them for a bounded spin instead of
// going to sleep in read(2) at once (docs/protocol.md, "Collective sidecar
// pipe", the bell). The frames still go through the pipe: the bell only
// says that one is there, so a missed or torn word costs a wake-up, never
// a frame, and no ordering between the words and the pipe is relied on.
//
// Layout (little-endian, each word on a cache line of its own):
//
//	offset  0: uint32 req   the low 32 bits of the id of the last request
//	                        the parent has written to the pipe (the parent
//	                        stores it after the write returns)
//	offset 64: uint32 resp  the low 32 bits of the id of the last reply
//	                        the sidecar has written (stored after the write)
//
// The rest of the file (bellSize bytes in all) is zero and reserved.
const (
	bellReq  = 0
	bellResp = 64
	bellSize = 4096
)

// bell is the sidecar's side of the bell file.
type bell struct {
	m    *shm.Map
	req  *shm.Uint32
	resp *shm.Uint32
	spin time.Duration // how long to watch req before sleeping in read(2)
}

// openBell maps the bell file at path (bellSize bytes at least, made by
// the parent). spin is the bounded spin of await.
func openBell(path string, spin time.Duration) (*bell, error) {
	m, err := shm.Open(path, bellSize, true) // checks the file's size
	if err != nil {
		return nil, fmt.Errorf("map the bell file: %w", err)
	}
	return &bell{m: m, req: m.Uint32(bellReq), resp: m.Uint32(bellResp), spin: spin}, nil
}

// await returns once the parent's req word differs from last (a request
// after the one numbered last is in the pipe, or coming), or after the
// spin: the caller then reads the pipe, which blocks only when no frame is
// there yet. It yields the processor between looks, so that on a machine
// with fewer cores than runnable processes the spin does not keep the
// parent, or another rank, from running. A nil bell returns at once.
func (b *bell) await(last uint32) {
	if b == nil || b.spin <= 0 || b.req.Load() != last {
		return
	}
	deadline := time.Now().Add(b.spin)
	for i := 1; b.req.Load() == last; i++ {
		if i%spinCheck == 0 {
			if time.Now().After(deadline) {
				return
			}
			shm.Yield()
		}
	}
}

// spinCheck is how many looks at the word go between two looks at the
// clock (and yields).
const spinCheck = 16

// rung stores the id of the reply just written.
func (b *bell) rung(id int64) {
	if b != nil {
		b.resp.Store(uint32(id))
	}
}

func (b *bell) close() {
	if b != nil {
		b.m.Close()
	}
}
