package collective

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Hierarchical communicators in one process: ranks told apart as hosts by
// their shared folders (a rank's host is its kernel and Config.ShmDir), so
// that ranks with the same folder share mappings and the others meet over
// loopback TCP. process_test.go and hier_netns_test.go run them as
// processes on network-namespace hosts.

// hierGroup forms a communicator whose rank r is on host hosts[r].
func hierGroup(t testing.TB, hosts []int, tr Transport) []*Comm {
	t.Helper()
	return hierGroupWith(t, hosts, tr, nil)
}

// hierGroupWith is hierGroup with each rank's Config changed by opt (nil:
// none).
func hierGroupWith(t testing.TB, hosts []int, tr Transport, opt func(*Config)) []*Comm {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("shared mappings need Linux")
	}
	n := len(hosts)
	addr := freeAddr(t)
	base := t.TempDir()
	comms := make([]*Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for r := range n {
		dir := filepath.Join(base, fmt.Sprintf("h%d", hosts[r]))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			cfg := Config{Rank: r, Size: n, Addr: addr, Transport: tr, ShmDir: dir}
			if opt != nil {
				opt(&cfg)
			}
			comms[r], errs[r] = Join(ctx, cfg)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: Join: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func TestGroupHosts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		keys  []string
		hosts []int
		worth bool
	}{
		{"one rank", []string{"a"}, []int{0}, false},
		{"one host", []string{"a", "a", "a"}, []int{0, 0, 0}, false},
		{"a rank each", []string{"a", "b", "c"}, []int{0, 1, 2}, false},
		{"two by two", []string{"a", "a", "b", "b"}, []int{0, 0, 1, 1}, true},
		{"interleaved", []string{"b", "a", "b", "a"}, []int{0, 1, 0, 1}, true},
		{"uneven", []string{"x", "y", "y", "y", "z"}, []int{0, 1, 1, 1, 2}, true},
		{"numbered by first rank", []string{"z", "y", "x", "x"}, []int{0, 1, 2, 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := groupHosts(tc.keys)
			if !reflect.DeepEqual(got, tc.hosts) {
				t.Fatalf("groupHosts(%q) = %v, want %v", tc.keys, got, tc.hosts)
			}
			if w := hierWorth(got); w != tc.worth {
				t.Fatalf("hierWorth(%v) = %v, want %v", got, w, tc.worth)
			}
			top := topologyOf(got)
			seen := 0
			for h, th := range top.Hosts {
				if th.Leader != th.Ranks[0] {
					t.Fatalf("host %d: leader %d, ranks %v", h, th.Leader, th.Ranks)
				}
				for _, r := range th.Ranks {
					if got[r] != h {
						t.Fatalf("rank %d listed on host %d, grouped on %d", r, h, got[r])
					}
				}
				seen += len(th.Ranks)
			}
			if seen != len(tc.keys) {
				t.Fatalf("topology lists %d ranks, want %d", seen, len(tc.keys))
			}
		})
	}
}

// TestJoin_KeyIsHostAndFolder: the join groups ranks by host identity and
// shared folder, not by either alone.
func TestJoin_KeyIsHostAndFolder(t *testing.T) {
	a := hostKey(&joinReq{Host: "h1", Dir: "/dev/shm"})
	if a == hostKey(&joinReq{Host: "h1", Dir: "/dev/shm2"}) || a == hostKey(&joinReq{Host: "h2", Dir: "/dev/shm"}) {
		t.Fatal("ranks on one host with different folders, or different hosts with one folder, share a key")
	}
	// No concatenation is ambiguous.
	if hostKey(&joinReq{Host: "a", Dir: "b/c"}) == hostKey(&joinReq{Host: "a/b", Dir: "c"}) {
		t.Fatal("keys collide")
	}
}

// TestHier_Topology: every rank of a 2x2 communicator (interleaved too)
// shows the same topology, and the transport per level.
func TestHier_Topology(t *testing.T) {
	for _, hosts := range [][]int{{0, 0, 1, 1}, {0, 1, 0, 1}, {0, 1, 1}} {
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			comms := hierGroup(t, hosts, Auto)
			want := topologyOf(hosts)
			want.Local, want.Between = SHM, TCP
			for _, c := range comms {
				if c.Transport() != Hier {
					t.Fatalf("rank %d: transport %v, want %v", c.Rank(), c.Transport(), Hier)
				}
				if got := c.Topology(); !reflect.DeepEqual(got, want) {
					t.Fatalf("rank %d: topology %+v, want %+v", c.Rank(), got, want)
				}
			}
		})
	}
}

// TestHier_FlatTopologies: communicators that are not hierarchical say so.
func TestHier_FlatTopologies(t *testing.T) {
	for _, tc := range []struct {
		name           string
		hosts          []int
		tr             Transport
		local, between Transport
		transport      Transport
	}{
		{"one host, shm", []int{0, 0, 0}, Auto, SHM, "", SHM},
		{"one host, tcp", []int{0, 0}, TCP, TCP, "", TCP},
		{"a rank per host", []int{0, 1, 2}, Auto, "", TCP, TCP},
		{"two by two, tcp asked", []int{0, 0, 1, 1}, TCP, TCP, TCP, TCP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := hierGroup(t, tc.hosts, tc.tr)
			want := topologyOf(tc.hosts)
			want.Local, want.Between = tc.local, tc.between
			for _, c := range comms {
				if c.Transport() != tc.transport {
					t.Fatalf("rank %d: transport %v, want %v", c.Rank(), c.Transport(), tc.transport)
				}
				if got := c.Topology(); !reflect.DeepEqual(got, want) {
					t.Fatalf("rank %d: topology %+v, want %+v", c.Rank(), got, want)
				}
			}
		})
	}
}

// TestHier_RequiredOnOneHost: Transport Hier on one host is ErrJoin on
// every rank, saying why.
func TestHier_RequiredOnOneHost(t *testing.T) {
	addr, dir := freeAddr(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			c, err := Join(ctx, Config{Rank: r, Size: 2, Addr: addr, Transport: Hier, ShmDir: dir})
			if err == nil {
				c.Close()
			}
			errs[r] = err
		})
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, ErrJoin) {
			t.Fatalf("rank %d: %v, want ErrJoin", r, err)
		}
		t.Logf("rank %d: %v", r, err)
	}
}

// TestHier_MatchPlainComputation runs every collective on hierarchical
// communicators and compares every rank's result with a plain
// single-process computation; then Allreduces large enough for the
// leaders' ring and pieces, whose bits must be the same on every rank.
func TestHier_MatchPlainComputation(t *testing.T) {
	for _, hosts := range testLayouts() {
		n := len(hosts)
		t.Run(fmt.Sprint(hosts), func(t *testing.T) {
			comms := hierGroup(t, hosts, Hier)
			for i, cc := range collCases(n) {
				t.Run(cc.name, func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(i)))
					xs := make([]*tensordict.Tensor, n)
					in := make([]nd, n)
					for r := range n {
						xs[r] = randTensor(t, rng, cc.dt, cc.shape(r, n)...)
						in[r] = toND(t, xs[r])
					}
					got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
						return cc.run(ctx, c, xs[c.Rank()])
					})
					want := cc.ref(in, n)
					tol := 1e-12
					if cc.dt == memmap.Float32 {
						tol = 1e-5
					}
					if cc.exact {
						tol = 0
					}
					for r := range n {
						if want[r].shape == nil {
							if got[r] != nil {
								t.Fatalf("rank %d: got %v, want nothing", r, got[r])
							}
							continue
						}
						if got[r] == nil {
							t.Fatalf("rank %d: got nothing, want %v", r, want[r].shape)
						}
						if g := toND(t, got[r]); !closeND(g, want[r], tol) {
							t.Fatalf("rank %d: got %v %v\nwant %v %v", r, g.shape, head(g.v), want[r].shape, head(want[r].v))
						}
					}
				})
			}
			for _, tc := range []struct {
				dt    memmap.DType
				op    Op
				elems int
			}{
				{memmap.Float64, Sum, 0},
				{memmap.Float64, Sum, 7},
				{memmap.Float64, Sum, 3},
				{memmap.Float32, Sum, 20_000},
				{memmap.Float64, Sum, 300_001}, // 2.4 MB: the ring, in pieces
				{memmap.Int32, Max, 1 << 18},
				{memmap.Float64, Prod, 100_000},
			} {
				t.Run(fmt.Sprintf("Allreduce %v %v %d", tc.op, tc.dt.Name(), tc.elems), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(tc.elems), uint64(n)))
					xs := make([]*tensordict.Tensor, n)
					in := make([]nd, n)
					for r := range n {
						xs[r] = randTensor(t, rng, tc.dt, tc.elems)
						in[r] = toND(t, xs[r])
					}
					want := reduce(in, tc.op, tc.dt)
					for round := range 3 { // file sets 0, 1 and 0 again
						got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) {
							if round == 1 {
								// In place.
								y, _ := tensordict.Zeros(tc.dt, tc.elems)
								b, _ := xs[c.Rank()].Bytes()
								yb, _ := y.Bytes()
								copy(yb, b)
								return y, c.AllreduceInto(ctx, y, y, tc.op)
							}
							return c.Allreduce(ctx, xs[c.Rank()], tc.op)
						})
						b0, _ := got[0].Bytes()
						for r := range n {
							tol := 1e-9
							if tc.dt == memmap.Float32 {
								tol = 1e-5
							}
							if !closeND(toND(t, got[r]), want, tol) {
								t.Fatalf("round %d: rank %d differs from the plain computation", round, r)
							}
							if b, _ := got[r].Bytes(); !bytes.Equal(b, b0) {
								t.Fatalf("round %d: rank %d's bits differ from rank 0's", round, r)
							}
						}
					}
				})
			}
		})
	}
}

// TestHier_ErrorsSameOnEveryRank: a mismatch, a rank calling another
// collective, and a bad argument give every rank the same error; the
// communicator goes on.
func TestHier_ErrorsSameOnEveryRank(t *testing.T) {
	comms := hierGroup(t, []int{0, 0, 1, 1}, Hier)
	for _, tc := range []struct {
		name string
		fn   func(ctx context.Context, c *Comm) (int, error)
		is   error
	}{
		{"shapes", func(ctx context.Context, c *Comm) (int, error) {
			x, _ := tensordict.Zeros(memmap.Float32, 4+c.Rank()/3)
			_, err := c.Allreduce(ctx, x, Sum)
			return 0, err
		}, ErrMismatch},
		{"another collective", func(ctx context.Context, c *Comm) (int, error) {
			x, _ := tensordict.Zeros(memmap.Float32, 4)
			if c.Rank() == 2 {
				_, err := c.Bcast(ctx, x, 0)
				return 0, err
			}
			_, err := c.Allreduce(ctx, x, Sum)
			return 0, err
		}, ErrMismatch},
		{"reduction", func(ctx context.Context, c *Comm) (int, error) {
			x, _ := tensordict.Zeros(memmap.Float32, 4)
			_, err := c.Allreduce(ctx, x, BXor)
			return 0, err
		}, ErrArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errs := onAll(t, comms, tc.fn)
			for r, err := range errs {
				if !errors.Is(err, tc.is) || err.Error() != errs[0].Error() {
					t.Fatalf("rank %d: %v; rank 0: %v; want the same %v", r, err, errs[0], tc.is)
				}
			}
			t.Logf("%v", errs[0])
		})
	}
	one, _ := tensordict.FromSlice([]float64{1})
	got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) { return c.Allreduce(ctx, one, Sum) })
	if v, _ := tensordict.Values[float64](got[3]); v[0] != 4 {
		t.Fatalf("after the errors: %v, want 4", v)
	}
}

// TestHier_RankGoneFailsEveryRank: in the middle of a hierarchy's
// Allreduce, a rank that closes instead of calling it fails every other
// with ErrPeerLost, and one whose context has ended breaks it off for all
// (its own call fails with its context's error, the others' with
// ErrAborted); none waits for its deadline.
func TestHier_RankGoneFailsEveryRank(t *testing.T) {
	for _, tc := range []struct {
		name string
		odd  func(ctx context.Context, c *Comm, x *tensordict.Tensor) error
		own  error // what the odd rank's call returns
		is   error // what the others' do
	}{
		{"closed", func(ctx context.Context, c *Comm, x *tensordict.Tensor) error { return c.Close() }, nil, ErrPeerLost},
		{"context ended", func(ctx context.Context, c *Comm, x *tensordict.Tensor) error {
			ctx, cancel := context.WithCancel(ctx)
			cancel()
			return c.AllreduceInto(ctx, x, x, Sum)
		}, context.Canceled, ErrAborted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := hierGroup(t, []int{0, 0, 1, 1}, Hier)
			start := time.Now()
			_, errs := onAll(t, comms, func(ctx context.Context, c *Comm) (int, error) {
				x, _ := tensordict.Zeros(memmap.Float32, 1<<20)
				if c.Rank() == 3 {
					return 0, tc.odd(ctx, c, x)
				}
				return 0, c.AllreduceInto(ctx, x, x, Sum)
			})
			for r, err := range errs {
				want := tc.is
				if r == 3 {
					want = tc.own
				}
				if want == nil && err != nil || want != nil && !errors.Is(err, want) {
					t.Fatalf("rank %d: %v, want %v", r, err, want)
				}
			}
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("the ranks took %v to fail", d)
			}
			t.Logf("rank 0: %v", errs[0])
		})
	}
}

// TestHier_FolderMissingFallsBack: a host whose shared folder cannot be
// made (its ShmDir does not exist) makes every rank fall back to TCP
// (Auto), or fail to join with ErrJoin, rank 0 saying which rank and why
// (Hier).
func TestHier_FolderMissingFallsBack(t *testing.T) {
	for _, tr := range []Transport{Auto, Hier} {
		t.Run(fmt.Sprintf("%q", tr), func(t *testing.T) {
			addr, base := freeAddr(t), t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			comms := make([]*Comm, 4)
			errs := make([]error, 4)
			var wg sync.WaitGroup
			for r := range 4 {
				dir := filepath.Join(base, fmt.Sprint("h", r/2))
				if r < 2 {
					os.MkdirAll(dir, 0o700)
				}
				wg.Go(func() {
					comms[r], errs[r] = Join(ctx, Config{Rank: r, Size: 4, Addr: addr, Transport: tr, ShmDir: dir})
				})
			}
			wg.Wait()
			for _, c := range comms {
				if c != nil {
					defer c.Close()
				}
			}
			for r := range 4 {
				if tr == Hier {
					// Rank 0 says why; the others may hear only that
					// rank 0 closed, when it does before its answer
					// reaches them (as with Transport SHM).
					if !errors.Is(errs[r], ErrJoin) || r == 0 && !strings.Contains(errs[r].Error(), "host's shared folder") {
						t.Fatalf("rank %d: %v, want ErrJoin (rank 0: saying the host's folder failed)", r, errs[r])
					}
					continue
				}
				if errs[r] != nil {
					t.Fatalf("rank %d: %v", r, errs[r])
				}
				if got := comms[r].Transport(); got != TCP {
					t.Fatalf("rank %d: transport %v, want tcp", r, got)
				}
			}
			if tr == Hier {
				t.Logf("rank 0: %v", errs[0])
				return
			}
			one, _ := tensordict.FromSlice([]float64{1})
			got := all(t, comms, func(ctx context.Context, c *Comm) (*tensordict.Tensor, error) { return c.Allreduce(ctx, one, Sum) })
			if v, _ := tensordict.Values[float64](got[2]); v[0] != 4 {
				t.Fatalf("allreduce: %v, want 4", v)
			}
		})
	}
}
