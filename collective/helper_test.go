package collective

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// group forms a communicator of n ranks in this process, each a Comm of
// its own with its own sockets (and mappings), closed when the test ends.
func group(t testing.TB, n int, tr Transport) []*Comm {
	t.Helper()
	return groupIn(t, n, tr, t.TempDir())
}

// groupIn is group with the shared mappings' folder dir.
func groupIn(t testing.TB, n int, tr Transport, dir string) []*Comm {
	t.Helper()
	return groupWith(t, n, tr, dir, nil)
}

// groupWith is groupIn with each rank's Config changed by opt (nil: none).
func groupWith(t testing.TB, n int, tr Transport, dir string, opt func(*Config)) []*Comm {
	t.Helper()
	addr := freeAddr(t)
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r := range n {
		wg.Go(func() {
			cfg := Config{Rank: r, Size: n, Addr: addr, Transport: tr, ShmDir: dir}
			if opt != nil {
				opt(&cfg)
			}
			comms[r], errs[r] = Join(ctx, cfg)
		})
	}
	wg.Wait()
	failed := false
	for r, err := range errs {
		if err != nil {
			// Every rank's error: rank 0's (the others did not join) says
			// nothing of why they did not.
			t.Errorf("rank %d: Join: %v", r, err)
			failed = true
		}
	}
	if failed {
		for _, c := range comms {
			if c != nil {
				c.Close()
			}
		}
		t.FailNow()
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	for _, c := range comms {
		if tr != Auto && c.Transport() != tr {
			t.Fatalf("transport %v, want %v", c.Transport(), tr)
		}
	}
	return comms
}

// onAll runs fn on every rank at once and returns their results.
func onAll[T any](t testing.TB, comms []*Comm, fn func(ctx context.Context, c *Comm) (T, error)) ([]T, []error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res := make([]T, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { res[r], errs[r] = fn(ctx, c) })
	}
	wg.Wait()
	return res, errs
}

// all is onAll that fails the test if any rank failed.
func all[T any](t testing.TB, comms []*Comm, fn func(ctx context.Context, c *Comm) (T, error)) []T {
	t.Helper()
	res, errs := onAll(t, comms, fn)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return res
}

// randTensor returns a tensor of random values of dtype dt, drawn from rng.
func randTensor(t testing.TB, rng *rand.Rand, dt memmap.DType, shape ...int) *tensordict.Tensor {
	t.Helper()
	x, err := tensordict.Zeros(dt, shape...)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := x.Bytes()
	es := dt.Size()
	for i := 0; i < len(b); i += es {
		switch dt {
		case memmap.Float32, memmap.Float64:
			dt.PutFloat64(b[i:], rng.Float64()*2-1)
		case memmap.Bool:
			b[i] = byte(rng.IntN(2))
		case memmap.Float16, memmap.BFloat16:
			dt.PutFloat64(b[i:], float64(rng.IntN(64))/8)
		default:
			dt.PutFloat64(b[i:], float64(rng.IntN(7)-3))
			if dt == memmap.Uint8 || dt == memmap.Uint16 || dt == memmap.Uint32 || dt == memmap.Uint64 {
				dt.PutFloat64(b[i:], float64(rng.IntN(4)))
			}
		}
	}
	return x
}

func transports() []Transport { return []Transport{SHM, TCP} }

func name(tr Transport, n int) string { return fmt.Sprintf("%s/%d", tr, n) }
