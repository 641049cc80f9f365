package replay_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/tensordict"
)

// A stack, as Reverb's: LIFO, each transition sampled once; then a delete
// and a reset.
func ExampleLIFO() {
	dir, _ := os.MkdirTemp("", "replay")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	b, err := replay.Create(filepath.Join(dir, "stack"), replay.Config{
		Capacity: 8, Sampler: replay.LIFO(), MaxTimesSampled: 1,
	})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	idx, _ := b.Extend(ctx, batch(4, 10)) // rewards 10, 11, 12, 13
	td, _, _ := b.Sample(ctx, 2)
	r, _ := td.Tensor("reward")
	rewards, _ := tensordict.Values[float32](r)
	fmt.Println(rewards, b.Len())

	n, _ := b.Delete(ctx, replay.SampleInfo{Indices: idx[:1]}) // reward 10
	fmt.Println(n, b.Len())
	_ = b.Reset(ctx)
	fmt.Println(b.Len())
	// Output:
	// [13 12] 2
	// 1 1
	// 0
}

// Episodes written step by step, interleaved, and sampled as slices that
// never cross an episode's end.
func ExampleBuffer_SampleSlices() {
	dir, _ := os.MkdirTemp("", "replay")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	b, err := replay.Create(filepath.Join(dir, "seq"), replay.Config{Capacity: 64, TrajKey: []string{"episode"}})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	step := func(episode int64, from, to int) *tensordict.TensorDict {
		var eps, ts []int64
		for t := from; t < to; t++ {
			eps, ts = append(eps, episode), append(ts, int64(t))
		}
		td, _ := tensordict.New(len(ts))
		e, _ := tensordict.FromSlice(eps, len(ts))
		s, _ := tensordict.FromSlice(ts, len(ts))
		td.Set("episode", e)
		td.Set("t", s)
		return td
	}
	b.Extend(ctx, step(1, 0, 3)) // two actors, interleaved
	b.Extend(ctx, step(2, 0, 2))
	b.Extend(ctx, step(1, 3, 5))
	b.Extend(ctx, step(2, 2, 3))
	spec := replay.SliceSpec{SliceLen: 4, NumSlices: 2}
	td, info, _ := b.SampleSlices(ctx, spec)
	ts, _ := td.Tensor("t")
	t, _ := tensordict.Values[int64](ts)
	fmt.Println(info.Episodes, len(t)) // only episode 1 holds 4 steps
	for _, e := range b.Episodes() {
		fmt.Println(e.ID, len(e.Slots))
	}
	// A training loop samples into the batch it holds, step after step.
	for range 3 {
		if _, err := b.SampleSlicesInto(ctx, spec, td); err != nil {
			panic(err)
		}
	}
	t, _ = tensordict.Values[int64](ts)
	fmt.Println(t[1]-t[0], t[3]-t[2]) // consecutive steps
	// Output:
	// [1 1] 8
	// 1 5
	// 2 3
	// 1 1
}

// Two slices of 3 steps; the first ends its episode at its second step.
func ExampleNStep() {
	reward := []float64{1, 1, 1, 1, 1, 1}
	done := []bool{false, true, false, false, false, false}
	r, _ := replay.NStep(reward, done, nil, 0.5, 2, 3)
	fmt.Println(r.Return, r.Discount, r.Steps)
	// Output:
	// [1.5 1 1 1.5 1.5 1] [0 0 0.5 0.25 0.25 0.5] [2 1 1 2 2 1]
}
