//go:build linux

package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/shm"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// sharedCase is one Allreduce of TestShared_Allreduce.
type sharedCase struct {
	dt    memmap.DType
	op    Op
	elems int
}

// wantReduce is the rank-order reduction of the ranks' bytes srcs.
func wantReduce(op Op, dt memmap.DType, srcs [][]byte) []byte {
	want := make([]byte, len(srcs[0]))
	foldRef(op, dt, want, srcs)
	return want
}

// fillBytes copies src into t's bytes.
func fillBytes(t testing.TB, dst *tensordict.Tensor, src []byte) {
	t.Helper()
	b, err := dst.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	copy(b, src)
}

// TestShared_Allreduce: AllreduceInto (and ReduceInto to the last rank)
// of tensors from Alloc, in place and into a second such tensor, over 2 to
// 4 ranks and sizes whose shares are not even: every rank gets the bits of
// the rank-order reduction (Reduce: the root; the others zeros), and the
// call went through sharedReduce on every rank (reading the inputs where
// they are), not the data files.
func TestShared_Allreduce(t *testing.T) {
	ranks, cases := []int{2, 3, 4}, []sharedCase{
		{memmap.Float32, Sum, 3*sharedChunk + 4097},
		{memmap.Float64, Sum, 50_001},
		{memmap.Int64, Sum, 20_003},
		{memmap.Uint8, Max, 300_001},
	}
	if raceEnabled {
		ranks, cases = []int{2, 4}, cases[:2]
	}
	for _, n := range ranks {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n, SHM)
			for _, tc := range cases {
				for _, inPlace := range []bool{true, false} {
					for _, root := range []int{-1, n - 1} { // -1: Allreduce
						t.Run(fmt.Sprintf("%v/%v/%d/in place %v/root %d", tc.dt, tc.op, tc.elems, inPlace, root), func(t *testing.T) {
							sharedCall(t, comms, tc, inPlace, root)
						})
					}
				}
			}
		})
	}
}

// sharedCall runs one case of TestShared_Allreduce.
func sharedCall(t *testing.T, comms []*Comm, tc sharedCase, inPlace bool, root int) {
	n := len(comms)
	rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.elems)))
	srcs := make([][]byte, n)
	for r := range n {
		srcs[r] = must1(randTensor(t, rng, tc.dt, tc.elems).Bytes())
	}
	want := wantReduce(tc.op, tc.dt, srcs)
	before := make([]uint64, n)
	for r, c := range comms {
		before[r] = c.shm.shared.Load()
	}
	got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
		x, err := c.Alloc(tc.dt, tc.elems)
		if err != nil {
			return nil, err
		}
		defer c.Free(x)
		fillBytes(t, x, srcs[c.Rank()])
		y := x
		if !inPlace {
			if y, err = c.Alloc(tc.dt, tc.elems); err != nil {
				return nil, err
			}
			defer c.Free(y)
		}
		if root < 0 {
			err = c.AllreduceInto(ctx, y, x, tc.op)
		} else {
			err = c.ReduceInto(ctx, y, x, tc.op, root)
		}
		if err != nil {
			return nil, err
		}
		if !inPlace && !bytes.Equal(must1(x.Bytes()), srcs[c.Rank()]) {
			return nil, errors.New("the input changed")
		}
		return bytes.Clone(must1(y.Bytes())), nil
	})
	for r := range n {
		w := want
		if root >= 0 && r != root {
			w = make([]byte, len(want))
		}
		if !bytes.Equal(got[r], w) {
			t.Fatalf("rank %d: not the rank-order reduction (or zeros off the root)", r)
		}
		if d := comms[r].shm.shared.Load() - before[r]; d != 1 {
			t.Fatalf("rank %d: %d calls through the shared buffers, want 1", r, d)
		}
	}
}

// TestShared_Mixed: when one rank's tensor is not a shared buffer (an
// ordinary tensor, or a partly overlapping output), every rank takes the
// data files' path, and the result is the same.
func TestShared_Mixed(t *testing.T) {
	const n = 3
	comms := group(t, n, SHM)
	// 100,000 float32 are one chunk of the pipelined path, 700,000 four:
	// the ranks whose tensors are shared copy their first chunks in only
	// when its data phase starts (deferredPipe).
	for _, tc := range []struct {
		odd   string
		elems int
	}{{"heap", 100_000}, {"overlap", 100_000}, {"heap", 700_000}} {
		odd, elems := tc.odd, tc.elems
		t.Run(fmt.Sprintf("%s-%d", odd, elems), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 7))
			srcs := make([][]byte, n)
			for r := range n {
				srcs[r] = must1(randTensor(t, rng, memmap.Float32, elems).Bytes())
			}
			want := wantReduce(Sum, memmap.Float32, srcs)
			got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
				x, err := c.Alloc(memmap.Float32, 2*elems)
				if err != nil {
					return nil, err
				}
				defer c.Free(x)
				b := must1(x.Bytes())
				in := must1(tensordict.FromBytes(memmap.Float32, []int{elems}, b[:4*elems]))
				out := in
				if c.Rank() == 1 {
					if odd == "heap" {
						in = must1(tensordict.Zeros(memmap.Float32, elems))
						out = in
					} else {
						out = must1(tensordict.FromBytes(memmap.Float32, []int{elems}, b[64:64+4*elems]))
					}
				}
				fillBytes(t, in, srcs[c.Rank()])
				if err := c.AllreduceInto(ctx, out, in, Sum); err != nil {
					return nil, err
				}
				return bytes.Clone(must1(out.Bytes())), nil
			})
			for r := range n {
				if !bytes.Equal(got[r], want) {
					t.Fatalf("rank %d: not the rank-order reduction", r)
				}
				if comms[r].shm.shared.Load() != 0 {
					t.Fatalf("rank %d: went through the shared buffers", r)
				}
			}
		})
	}
}

// TestShared_Register: a file of the caller's, mapped by it, registered
// and then unlinked (as a Python rank does its data file), is read and
// written in place, at an offset; after it grows and is registered with
// its new mapping, a tensor past its old end is too (the others map it
// again); after Deregister the data files' path runs.
func TestShared_Register(t *testing.T) {
	const n, elems = 2, 70_000
	comms := group(t, n, SHM)
	dir, err := os.MkdirTemp(filepath.Dir(comms[0].shm.folder()), "register-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	files := make([]*os.File, n)
	maps := make([]*shm.Map, n)
	for r := range n {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("data-%d", r)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if err := shm.Grow(f, 1<<20); err != nil {
			t.Fatal(err)
		}
		if maps[r], err = shm.MapFile(f, 1<<20, true); err != nil {
			t.Fatal(err)
		}
		files[r] = f
		if err := comms[r].Register(f.Name(), maps[r].Bytes()); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f.Name()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, m := range maps {
			m.Close()
		}
	})
	// run reduces each rank's input at at into its output at outAt (in
	// place when they are the same) and checks the result.
	run := func(t *testing.T, at, outAt int, wantShared uint64) {
		rng := rand.New(rand.NewPCG(uint64(at), 1))
		srcs := make([][]byte, n)
		for r := range n {
			srcs[r] = must1(randTensor(t, rng, memmap.Float32, elems).Bytes())
		}
		want := wantReduce(Sum, memmap.Float32, srcs)
		got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
			b := maps[c.Rank()].Bytes()[at : at+4*elems]
			x := must1(tensordict.FromBytes(memmap.Float32, []int{elems}, b))
			ob := maps[c.Rank()].Bytes()[outAt : outAt+4*elems]
			y := must1(tensordict.FromBytes(memmap.Float32, []int{elems}, ob))
			copy(b, srcs[c.Rank()])
			if err := c.AllreduceInto(ctx, y, x, Sum); err != nil {
				return nil, err
			}
			if outAt != at && !bytes.Equal(b, srcs[c.Rank()]) {
				return nil, fmt.Errorf("rank %d: the input changed", c.Rank())
			}
			return bytes.Clone(ob), nil
		})
		for r := range n {
			if !bytes.Equal(got[r], want) {
				t.Fatalf("rank %d: not the rank-order reduction", r)
			}
			if s := comms[r].shm.shared.Load(); s != wantShared {
				t.Fatalf("rank %d: %d calls through the shared buffers, want %d", r, s, wantShared)
			}
		}
	}
	run(t, 4096, 4096, 1)
	for r := range n {
		if err := shm.Grow(files[r], 4<<20); err != nil {
			t.Fatal(err)
		}
		m, err := shm.MapFile(files[r], 4<<20, true)
		if err != nil {
			t.Fatal(err)
		}
		maps[r].Close()
		maps[r] = m
		if err := comms[r].Register(files[r].Name(), m.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	// The input where the others mapped the file before it grew, the
	// output past that: their mapping of each file grows within the call
	// (and the one the input was read through stays until it is done).
	run(t, 4096, 3<<20, 2)
	run(t, 3<<20, 3<<20, 3)
	for r := range n {
		if err := comms[r].Deregister(files[r].Name()); err != nil {
			t.Fatal(err)
		}
		if err := comms[r].Deregister(files[r].Name()); !errors.Is(err, ErrNotShared) {
			t.Fatalf("a second Deregister: %v, want ErrNotShared", err)
		}
	}
	run(t, 0, 0, 3) // through the data files
}

// TestShared_AllocFree: Alloc's tensors are files of the folder until
// Free; Free refuses a tensor Alloc did not make; on TCP Alloc is an
// ordinary tensor.
func TestShared_AllocFree(t *testing.T) {
	comms := group(t, 2, SHM)
	c := comms[0]
	x, err := c.Alloc(memmap.Float32, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	if s := x.Shape(); len(s) != 2 || s[0] != 3 || s[1] != 5 {
		t.Fatalf("shape %v", s)
	}
	if !bytes.Equal(must1(x.Bytes()), make([]byte, 60)) {
		t.Fatal("not zeroed")
	}
	files, _ := filepath.Glob(filepath.Join(c.shm.folder(), "rank-0.s*"))
	if len(files) != 1 {
		t.Fatalf("files %v, want one", files)
	}
	if err := c.Free(must1(tensordict.Zeros(memmap.Float32, 3))); !errors.Is(err, ErrNotShared) {
		t.Fatalf("Free of an ordinary tensor: %v, want ErrNotShared", err)
	}
	if err := c.Free(x); err != nil {
		t.Fatal(err)
	}
	if files, _ := filepath.Glob(filepath.Join(c.shm.folder(), "rank-0.s*")); len(files) != 0 {
		t.Fatalf("files %v after Free", files)
	}
	if err := c.Free(x); !errors.Is(err, ErrNotShared) {
		t.Fatalf("a second Free: %v, want ErrNotShared", err)
	}
	// A tensor of no elements has nothing to share: an ordinary one, and
	// Free of it is nil.
	z, err := c.Alloc(memmap.Float32, 0, 3)
	if err != nil || len(z.Shape()) != 2 || z.Shape()[0] != 0 {
		t.Fatalf("Alloc of no elements: %v, %v", z, err)
	}
	if err := c.Free(z); err != nil {
		t.Fatalf("Free of no elements: %v", err)
	}
	tc := group(t, 2, TCP)[0]
	y, err := tc.Alloc(memmap.Int64, 4)
	if err != nil || len(must1(y.Bytes())) != 32 {
		t.Fatalf("Alloc on TCP: %v", err)
	}
	if err := tc.Free(y); err != nil {
		t.Fatal(err)
	}
}

// TestShared_Truncated: a rank's shared buffer truncated under the others
// (by hand, or a rank gone wrong) fails the Allreduce on every rank with an
// error, not a fault that kills the process, and nothing hangs.
func TestShared_Truncated(t *testing.T) {
	const n, elems = 3, 100_000
	comms := group(t, n, SHM)
	xs := make([]*tensordict.Tensor, n)
	for r, c := range comms {
		xs[r] = must1(c.Alloc(memmap.Float32, elems))
	}
	path := filepath.Join(comms[2].shm.folder(), "rank-2.s0")
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (struct{}, error) {
		return struct{}{}, c.AllreduceInto(ctx, xs[c.Rank()], xs[c.Rank()], Sum)
	})
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d: no error", r)
		}
	}
}

// TestShared_Exposed: Bcast (in place on the root, and not), Gather,
// Allgather, Scatter and Alltoall of inputs from Alloc read them where
// they are (no publish), give what the same calls of ordinary tensors
// give, and the rank whose input was read in place returns only once every
// reader is done: each rank overwrites its input as soon as its call
// returns, while rank 2 reads late, and still gets the right bytes.
func TestShared_Exposed(t *testing.T) {
	const n = 3
	comms := group(t, n, SHM)
	var reads atomic.Int64
	testSharedRead = func(rank int) {
		reads.Add(1)
		if rank == n-1 {
			time.Sleep(30 * time.Millisecond)
		}
	}
	t.Cleanup(func() { testSharedRead = nil })
	type opCase struct {
		name  string
		shape []int
		run   func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error)
	}
	cases := []opCase{
		{"bcast", []int{6, 500}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			return c.Bcast(ctx, x, 1)
		}},
		{"bcast in place", []int{6, 500}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			y := must1(tensordict.Zeros(memmap.Float32, 6, 500))
			if c.Rank() == 1 {
				y = x
			}
			if err := c.BcastInto(ctx, y, 1); err != nil {
				return nil, err
			}
			return y.Clone()
		}},
		{"gather", []int{4, 300}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			return c.Gather(ctx, x, 0, 0)
		}},
		{"allgather", []int{4, 300}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			return c.Allgather(ctx, x, 1)
		}},
		{"scatter", []int{6, 400}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			return c.Scatter(ctx, x, 0, nil, 2)
		}},
		{"alltoall", []int{6, 400}, func(ctx context.Context, c *Comm, x *tensordict.Tensor) (*tensordict.Tensor, error) {
			return c.Alltoall(ctx, x, 1, 0, nil)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, uint64(len(tc.name))))
			srcs := make([][]byte, n)
			for r := range n {
				srcs[r] = must1(randTensor(t, rng, memmap.Float32, tc.shape...).Bytes())
			}
			want := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
				x := must1(tensordict.FromBytes(memmap.Float32, tc.shape, bytes.Clone(srcs[c.Rank()])))
				y, err := tc.run(ctx, c, x)
				if err != nil || y == nil {
					return nil, err
				}
				return bytes.Clone(must1(y.Bytes())), nil
			})
			reads.Store(0)
			got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
				x, err := c.Alloc(memmap.Float32, tc.shape...)
				if err != nil {
					return nil, err
				}
				defer c.Free(x)
				fillBytes(t, x, srcs[c.Rank()])
				y, err := tc.run(ctx, c, x)
				// The caller's next step writes its input at once.
				for i, b := 0, must1(x.Bytes()); i < len(b); i++ {
					b[i] = 0xff
				}
				if err != nil || y == nil {
					return nil, err
				}
				return bytes.Clone(must1(y.Bytes())), nil
			})
			for r := range n {
				if !bytes.Equal(got[r], want[r]) {
					t.Fatalf("rank %d: not what ordinary tensors give", r)
				}
			}
			if reads.Load() == 0 {
				t.Fatal("no input was read in its shared buffer")
			}
		})
	}
}

// TestShared_ReduceScatter: a ReduceScatter of inputs from Alloc (pieces
// along the first and the last axis, equal and uneven) reduces each
// rank's piece from every rank's input in place: what ordinary tensors
// give, bit for bit, through sharedReduceScatter on every rank, though
// rank 1 reads late and every rank overwrites its input as soon as its
// call returns. An output over its rank's own input is not read in place
// (the data files' path), with the same result.
func TestShared_ReduceScatter(t *testing.T) {
	ranks := []int{2, 3, 4}
	if raceEnabled {
		ranks = []int{3}
	}
	// The last rank reads late; every rank overwrites its input as soon as
	// its call returns.
	testSharedRead = func(rank int) {
		if rank == 1 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	t.Cleanup(func() { testSharedRead = nil })
	for _, n := range ranks {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := group(t, n, SHM)
			rows, cols := 6*n+1, 3000 // above smallShm
			for _, tc := range []struct {
				axis   int
				counts []int
			}{{0, nil}, {1, nil}, {0, splitUneven(rows, n)}, {1, splitUneven(cols, n)}} {
				if tc.counts == nil && (tc.axis == 0 && rows%n != 0 || tc.axis == 1 && cols%n != 0) {
					continue // nil counts need an even split
				}
				for _, into := range []string{"new", "alloc", "over input"} {
					t.Run(fmt.Sprintf("axis %d/counts %v/%s", tc.axis, tc.counts, into), func(t *testing.T) {
						rng := rand.New(rand.NewPCG(uint64(n), uint64(tc.axis)))
						srcs := make([][]byte, n)
						for r := range n {
							srcs[r] = must1(randTensor(t, rng, memmap.Float32, rows, cols).Bytes())
						}
						want := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
							x := must1(tensordict.FromBytes(memmap.Float32, []int{rows, cols}, bytes.Clone(srcs[c.Rank()])))
							y, err := c.ReduceScatter(ctx, x, Sum, tc.axis, tc.counts)
							if err != nil {
								return nil, err
							}
							return bytes.Clone(must1(y.Bytes())), nil
						})
						before := make([]uint64, n)
						for r, c := range comms {
							before[r] = c.shm.shared.Load()
						}
						got := all(t, comms, func(ctx context.Context, c *Comm) ([]byte, error) {
							x, err := c.Alloc(memmap.Float32, rows, cols)
							if err != nil {
								return nil, err
							}
							defer c.Free(x)
							fillBytes(t, x, srcs[c.Rank()])
							var y *tensordict.Tensor
							switch into {
							case "new":
								y, err = c.ReduceScatter(ctx, x, Sum, tc.axis, tc.counts)
							default:
								shape := []int{rows, cols}
								shape[tc.axis] = len(want[c.Rank()]) / 4 / (rows * cols / shape[tc.axis])
								if into == "alloc" {
									y = must1(c.Alloc(memmap.Float32, shape...))
									defer c.Free(y)
								} else {
									y = must1(tensordict.FromBytes(memmap.Float32, shape, must1(x.Bytes())[:len(want[c.Rank()])]))
								}
								err = c.ReduceScatterInto(ctx, y, x, Sum, tc.axis, tc.counts)
							}
							if err != nil {
								return nil, err
							}
							res := bytes.Clone(must1(y.Bytes()))
							for i, b := 0, must1(x.Bytes()); i < len(b); i++ {
								b[i] = 0xff
							}
							return res, nil
						})
						for r := range n {
							if !bytes.Equal(got[r], want[r]) {
								t.Fatalf("rank %d: not what ordinary tensors give", r)
							}
							wantShared := uint64(1)
							if into == "over input" {
								wantShared = 0
							}
							if d := comms[r].shm.shared.Load() - before[r]; d != wantShared {
								t.Fatalf("rank %d: %d calls in place, want %d", r, d, wantShared)
							}
						}
					})
				}
			}
		})
	}
}

// splitUneven returns counts of n pieces of total, the first ones larger.
func splitUneven(total, n int) []int {
	c := make([]int, n)
	base, left := (total-n*(n-1)/2)/n, total
	for i := range n - 1 {
		c[i] = base + (n - 1 - i)
		left -= c[i]
	}
	c[n-1] = left
	return c
}
