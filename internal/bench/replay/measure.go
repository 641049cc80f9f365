package replay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/tensordict"
)

// gatherLeaf is one leaf of the storage for memcpyGather: its mapped bytes
// and a Go buffer for a batch of its rows.
type gatherLeaf struct {
	data     []byte
	rowBytes int
	dst      []byte
}

// memcpyGather measures the memcpy limit of sampling from storage, a
// memory-mapped TensorDict of transitions: for d, it copies batches of
// batchRows rows, picked uniformly at random, of every leaf out of the
// mapping into Go buffers with copy(), and returns the transitions copied
// per second. Before timing it reads every page of the mapping once and
// copies untimed for d/8, so that the figure is warm: no page faults,
// buffers touched. Nothing else is done per row: this is the rate no
// sampler reading this storage can beat.
//
// The mapped bytes are read without fault guards; the caller keeps the
// file from being truncated (the buffer node holds it).
func memcpyGather(storage *tensordict.TensorDict, batchRows int, d time.Duration) (float64, error) {
	rows := storage.BatchSize()[0]
	var leaves []gatherLeaf
	for path, t := range storage.Leaves() {
		mm, off := t.Mapping()
		if mm == nil {
			return 0, fmt.Errorf("leaf %v is not memory-mapped", path)
		}
		b, err := mm.Bytes()
		if err != nil {
			return 0, err
		}
		leaves = append(leaves, gatherLeaf{
			data:     b[off : off+int64(t.NumBytes())],
			rowBytes: t.RowBytes(),
			dst:      benchkit.Touched(batchRows * t.RowBytes()),
		})
	}
	page := os.Getpagesize()
	for _, l := range leaves {
		var x byte
		for i := 0; i < len(l.data); i += page {
			x += l.data[i]
		}
		runtime.KeepAlive(x) // the loads must happen: x is used
	}
	rng := rand.New(rand.NewPCG(1, 2))
	picked := make([]int, batchRows)
	round := func() {
		for i := range picked {
			picked[i] = rng.IntN(rows)
		}
		for _, l := range leaves {
			rb := l.rowBytes
			for j, r := range picked {
				copy(l.dst[j*rb:(j+1)*rb], l.data[r*rb:(r+1)*rb])
			}
		}
	}
	for start := time.Now(); time.Since(start) < d/8; {
		round()
	}
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		round()
		n++
	}
	return float64(n*batchRows) / time.Since(start).Seconds(), nil
}

// heapPoll is what pollHeap saw.
type heapPoll struct {
	max   uint64 // the largest Stats.NodeHeap
	polls int
	err   error // the first failed poll's, unless ctx ended it
}

// pollHeap calls c.Stats now and every interval until ctx ends, and sends
// the largest node heap it saw on out.
func pollHeap(ctx context.Context, c *replay.Client, interval time.Duration, out chan<- heapPoll) {
	var hp heapPoll
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		st, err := c.Stats(ctx)
		switch {
		case err == nil:
			hp.max = max(hp.max, st.NodeHeap)
			hp.polls++
		case ctx.Err() == nil && hp.err == nil:
			hp.err = fmt.Errorf("polling the node's heap: %w", err)
		}
		select {
		case <-ctx.Done():
			out <- hp
			return
		case <-t.C:
		}
	}
}
