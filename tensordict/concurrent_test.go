package tensordict

import (
	"errors"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// TestTensorDict_ConcurrentRowsAndClose has writers fill disjoint rows of a
// memory-mapped TensorDict while readers gather random rows, then closes it
// under them: every call succeeds or fails with memmap.ErrClosed, nothing
// crashes, and every row a writer finished holds its writer's value.
func TestTensorDict_ConcurrentRowsAndClose(t *testing.T) {
	const rows, writers, readers = 64, 4, 4
	src := mustNew(t, rows)
	src.Set("obs", must[*Tensor](t)(Zeros(memmap.Float32, rows, 128)))
	src.SetPath([]string{"next", "id"}, must[*Tensor](t)(Zeros(memmap.Int64, rows)))
	td := must[*TensorDict](t)(src.Memmap(filepath.Join(t.TempDir(), "p")))

	var wg sync.WaitGroup
	done := make([][]int, writers) // rows each writer finished
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := w; r < rows; r += writers {
				if err := td.Fill([]int{r}, float64(w+1)); err != nil {
					t.Errorf("writer %d row %d: %v", w, r, err)
					return
				}
				done[w] = append(done[w], r)
			}
		}()
	}
	for g := range readers {
		batch := must[*TensorDict](t)(td.Gather([]int{0, 1})) // t.Fatal only in the test's goroutine
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for range 500 {
				idx := []int{rng.IntN(rows), rng.IntN(rows)}
				if err := td.GatherInto(batch, idx); err != nil {
					t.Errorf("reader %d: %v", g, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for w, rs := range done {
		for _, r := range rs {
			row := must[*TensorDict](t)(td.Index(r))
			if got := values[float32](t, row, "obs"); !slices.Equal(got, slices.Repeat([]float32{float32(w + 1)}, 128)) {
				t.Fatalf("row %d holds %v..., want writer %d's value", r, got[:2], w+1)
			}
		}
	}

	// Now race Close against more calls: Close comes once every goroutine
	// has made a call, and each calls until it sees ErrClosed.
	var started sync.WaitGroup
	for g := range readers {
		batch := must[*TensorDict](t)(src.Gather([]int{0}))
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				if i == 1 {
					started.Done()
				}
				var err error
				if g%2 == 0 {
					err = td.GatherInto(batch, []int{i % rows})
				} else {
					err = td.Fill([]int{i % rows}, 3)
				}
				switch {
				case errors.Is(err, memmap.ErrClosed) && i > 0:
					return
				case err != nil:
					t.Errorf("call %d around Close: %v", i, err)
					if i == 0 {
						started.Done()
					}
					return
				}
			}
		}()
	}
	started.Wait()
	if err := td.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
}

// TestTensorDict_FlushAndPrefaultConcurrentWithClose runs Flush and
// Prefault in goroutines while the TensorDict is closed: each call returns
// nil, memmap.ErrClosed or (Prefault, where the system cannot)
// errors.ErrUnsupported, and nothing crashes. Close is documented to wait
// for the calls in flight; before the fix it cleared the list of mappings
// that Flush and Prefault read without a lock, a data race that the race
// detector reports.
func TestTensorDict_FlushAndPrefaultConcurrentWithClose(t *testing.T) {
	src := mustNew(t, 4)
	src.Set("x", must[*Tensor](t)(Zeros(memmap.Float32, 4, 8)))
	src.SetPath([]string{"n", "y"}, must[*Tensor](t)(Zeros(memmap.Int64, 4)))
	td := must[*TensorDict](t)(src.Memmap(filepath.Join(t.TempDir(), "p")))
	var wg, started sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if i == 1 {
					started.Done()
				}
				var err error
				if g%2 == 0 {
					err = td.Flush()
				} else {
					err = td.Prefault()
				}
				if err != nil && !errors.Is(err, memmap.ErrClosed) && !errors.Is(err, errors.ErrUnsupported) {
					t.Errorf("call %d around Close: %v", i, err)
				}
			}
		}()
	}
	started.Wait()
	if err := td.Close(); err != nil {
		t.Error(err)
	}
	wg.Wait()
}
