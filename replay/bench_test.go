package replay

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// BenchmarkBuffer_Lap times Extend writing a buffer's capacity once over,
// in batches of 64 Atari-like transitions (uint8 [84, 84, 4] obs, action,
// reward, done: 28,237 bytes, as benchmarks/replay's): lap=1 on a new
// buffer, whose pages nobody has touched (the first lap of a run), lap=2
// and lap=3 over the same slots again, after one and two untimed laps. One
// op is one lap; MB/s counts transition bytes. Run it with
//
//	go test -run '^$' -bench Buffer_Lap -benchtime 20x ./replay
func BenchmarkBuffer_Lap(b *testing.B) {
	const capacity, batch = 2048, 64
	schema := tensordict.RowSchema{
		{Key: []string{"obs"}, DType: memmap.Uint8, Shape: []int{84, 84, 4}},
		{Key: []string{"action"}, DType: memmap.Int64},
		{Key: []string{"reward"}, DType: memmap.Float32},
		{Key: []string{"done"}, DType: memmap.Bool},
	}
	td, err := tensordict.New(batch)
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range schema {
		x, err := tensordict.Zeros(f.DType, append([]int{batch}, f.Shape...)...)
		if err != nil {
			b.Fatal(err)
		}
		if err := x.Fill(allRows(batch), 3); err != nil { // touched: no page faults of its own
			b.Fatal(err)
		}
		if err := td.Set(f.Key[0], x); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	for _, lap := range []int{1, 2, 3} {
		b.Run("lap="+string(rune('0'+lap)), func(b *testing.B) {
			b.SetBytes(capacity * (84*84*4 + 8 + 4 + 1))
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				dir, err := os.MkdirTemp("", "replay-bench-*")
				if err != nil {
					b.Fatal(err)
				}
				buf, err := Create(filepath.Join(dir, "buf"), Config{Capacity: capacity, Schema: schema})
				if err != nil {
					os.RemoveAll(dir)
					b.Fatal(err)
				}
				extendLap := func() {
					for range capacity / batch {
						if _, err := buf.Extend(ctx, td); err != nil {
							b.Fatal(err)
						}
					}
				}
				for range lap - 1 {
					extendLap()
				}
				b.StartTimer()
				extendLap()
				b.StopTimer()
				err = buf.Close()
				os.RemoveAll(dir) // its dirty pages go too, instead of being written back during the next lap
				if err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

func allRows(n int) []int {
	rows := make([]int, n)
	for i := range rows {
		rows[i] = i
	}
	return rows
}
