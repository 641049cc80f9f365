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
