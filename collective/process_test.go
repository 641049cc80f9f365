package collective

// Tests with every rank a process of its own: this test binary run again
// with -test.run=^TestHelperProcess$ and the environment saying which rank
// to be and what to do (internal/testkit/proctest).

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

const (
	envRole      = "TENSORWIRE_COLLECTIVE_ROLE" // "check" or "loop"
	envRank      = "TENSORWIRE_COLLECTIVE_RANK"
	envSize      = "TENSORWIRE_COLLECTIVE_SIZE"
	envAddr      = "TENSORWIRE_COLLECTIVE_ADDR"
	envTransport = "TENSORWIRE_COLLECTIVE_TRANSPORT"
	envDir       = "TENSORWIRE_COLLECTIVE_DIR"
	envToken     = "TENSORWIRE_COLLECTIVE_TOKEN" // Config.Token; unset: none
	envOp        = "TENSORWIRE_COLLECTIVE_OP"    // the "loop" role's collective: allreduce (unset) or helperLoop's others
)

// TestHelperProcess is not a test: it is the body of the rank processes,
// and skips unless run as one.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("the body of a helper process")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	size, _ := strconv.Atoi(os.Getenv(envSize))
	cfg := Config{Rank: rank, Size: size, Addr: os.Getenv(envAddr), Transport: Transport(os.Getenv(envTransport)), ShmDir: os.Getenv(envDir)}
	if tok, ok := os.LookupEnv(envToken); ok {
		cfg.Token = []byte(tok)
	}
	if role == "join" {
		// Join without a deadline, and say how it ended.
		start := time.Now()
		c, err := Join(context.Background(), cfg)
		if err == nil {
			fmt.Println("JOINED", c.Transport())
			c.Close()
			os.Exit(0)
		}
		fmt.Printf("JOINERR unauthenticated=%v rpc=%v ms=%d len=%d %s\n", errors.Is(err, ErrUnauthenticated),
			errors.Is(err, rpc.ErrUnauthenticated), time.Since(start).Milliseconds(), len(err.Error()), err)
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Join(ctx, cfg)
	if err != nil {
		helperFail(err)
	}
	fmt.Println("JOINED", c.Transport())
	switch role {
	case "check":
		helperCheck(ctx, c)
	case "loop":
		helperLoop(ctx, c, cfg)
	case "dot":
		helperDot(t, ctx, c)
	case "hier":
		helperHier(ctx, c)
	case "check-rejoin":
		one, _ := tensordict.FromSlice([]float64{1})
		y, err := c.Allreduce(ctx, one, Sum)
		if err != nil {
			helperFail(err)
		}
		v, _ := tensordict.Values[float64](y)
		fmt.Println("REJOINED", v[0])
	}
	c.Close()
	os.Exit(0)
}

// helperDot runs the dot-product test's forward and backward of every
// adjoint case on this rank and prints "DOT case lhs rhs" for each.
func helperDot(t *testing.T, ctx context.Context, c *Comm) {
	n := c.Size()
	for i, ac := range adjCases(n) {
		rng := rand.New(rand.NewPCG(uint64(n)*7919, uint64(i)))
		var x0 *tensordict.Tensor
		for r := range n { // every rank draws every rank's x, keeps its own
			x := randTensor(t, rng, memmap.Float64, ac.shape(r, n)...)
			if r == c.Rank() {
				x0 = x
			}
		}
		tp := NewTape(c)
		x := tp.Leaf(x0)
		y, err := ac.fwd(ctx, tp, x)
		if err != nil {
			helperFail(fmt.Errorf("%s: %w", ac.name, err))
		}
		var seed *tensordict.Tensor
		var lhs float64
		if y != nil && y.Value() != nil {
			rr := rand.New(rand.NewPCG(uint64(c.Rank())+1, uint64(i)+99))
			seed = randTensor(t, rr, memmap.Float64, y.Value().Shape()...)
			lhs = dotT(t, y.Value(), seed)
		}
		if err := tp.Backward(ctx, y, seed); err != nil {
			helperFail(fmt.Errorf("%s: %w", ac.name, err))
		}
		fmt.Printf("DOT %s %v %v\n", ac.name, lhs, dotT(t, x.Value(), x.Grad()))
	}
	fmt.Println("DOTS DONE")
}

func helperFail(err error) {
	fmt.Fprintln(os.Stderr, "helper:", err)
	fmt.Println("FAIL", err)
	os.Exit(3)
}

// helperCheck runs a few collectives and checks their results.
func helperCheck(ctx context.Context, c *Comm) {
	n, me := c.Size(), c.Rank()
	v := make([]float32, 1<<18) // 1 MiB: the ring
	for i := range v {
		v[i] = float32(me + i%7)
	}
	x, _ := tensordict.FromSlice(v)
	y, err := c.Allreduce(ctx, x, Sum)
	if err != nil {
		helperFail(err)
	}
	got, _ := tensordict.Values[float32](y)
	for i, g := range got {
		if want := float32(n*(n-1)/2 + n*(i%7)); g != want {
			helperFail(fmt.Errorf("allreduce[%d] = %v, want %v", i, g, want))
		}
	}
	r, _ := tensordict.FromSlice(make([]int64, me+1), me+1)
	for i := range me + 1 {
		memmap.Int64.PutFloat64(must1(r.Bytes())[8*i:], float64(me))
	}
	g, err := c.Allgather(ctx, r, 0)
	if err != nil {
		helperFail(err)
	}
	gv, _ := tensordict.Values[int64](g)
	k := 0
	for rr := range n {
		for range rr + 1 {
			if gv[k] != int64(rr) {
				helperFail(fmt.Errorf("allgather[%d] = %d, want %d", k, gv[k], rr))
			}
			k++
		}
	}
	fmt.Println("OK")
}

func must1[T any](v T, err error) T {
	if err != nil {
		helperFail(err)
	}
	return v
}

// helperLoop allreduces 4 MiB again and again (or, as $envOp says,
// broadcasts it from rank 0, reduces it to rank 0, reduce-scatters it,
// alltoalls it, allgathers 1 MiB a rank, gathers 1 MiB a rank to rank 0,
// or scatters 1 MiB a rank from rank 0), printing "ITER
// i", until an error, which it prints as "ERR sentinel after": then it
// joins again (a new communicator, same rendezvous), allreduces once and
// prints "REJOINED".
func helperLoop(ctx context.Context, c *Comm, cfg Config) {
	x, _ := tensordict.Zeros(memmap.Float32, 1<<20)
	piece, _ := tensordict.Zeros(memmap.Float32, 1<<18)
	all, _ := tensordict.Zeros(memmap.Float32, c.Size()<<18)
	rs, _ := tensordict.Zeros(memmap.Float32, (1<<20)/c.Size())
	a2aIn := must1(tensordict.FromBytes(memmap.Float32, []int{c.Size(), (1 << 20) / c.Size()}, must1(x.Bytes())))
	a2aOut := must1(tensordict.FromBytes(memmap.Float32, []int{1, 1 << 20}, make([]byte, 4<<20)))
	op := os.Getenv(envOp)
	if op == "alloc-allreduce" || op == "alloc-allgather" {
		// Shared buffers: the Allreduce in place, the Allgather's inputs
		// exposed.
		x = must1(c.Alloc(memmap.Float32, 1<<20))
		piece = must1(c.Alloc(memmap.Float32, 1<<18))
	}
	for i := 0; ; i++ {
		start := time.Now()
		opCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		var err error
		switch op {
		case "bcast":
			err = c.BcastInto(opCtx, x, 0)
		case "allgather", "alloc-allgather":
			err = c.AllgatherInto(opCtx, all, piece, 0)
		case "reduce":
			err = c.ReduceInto(opCtx, x, x, Sum, 0)
		case "reduce-scatter":
			err = c.ReduceScatterInto(opCtx, rs, x, Sum, 0, nil)
		case "gather":
			err = c.GatherInto(opCtx, all, piece, 0, 0)
		case "scatter":
			err = c.ScatterInto(opCtx, piece, all, 0, nil, 0)
		case "alltoall":
			err = c.AlltoallInto(opCtx, a2aOut, a2aIn, 1, 0, nil)
		case "p2p-ring":
			// Point-to-point around the ring, 1 KiB (one chunk, which an
			// inbox's loop delivers itself) and 4 MiB (pipelined) in
			// turns: an Isend to the next rank, a Recv from the one before.
			n := 1 << 8
			if i%2 == 1 {
				n = 1 << 20
			}
			out, in := must1(x.Slice(0, n)), must1(piece.Slice(0, min(n, 1<<18)))
			if n > 1<<18 {
				in = must1(all.Slice(0, n))
			}
			r := c.Isend(opCtx, out, (c.Rank()+1)%c.Size(), i)
			err = c.Recv(opCtx, in, (c.Rank()+c.Size()-1)%c.Size(), i)
			if werr := r.Wait(opCtx); err == nil {
				err = werr
			}
		default:
			err = c.AllreduceInto(opCtx, x, x, Sum)
		}
		cancel()
		if err != nil {
			what := "other"
			switch {
			case errors.Is(err, ErrPeerLost):
				what = "peer_lost"
			case errors.Is(err, ErrAborted):
				what = "aborted"
			case errors.Is(err, context.DeadlineExceeded):
				what = "deadline"
			}
			fmt.Printf("ERR %s %d %v\n", what, time.Since(start).Milliseconds(), err)
			break
		}
		fmt.Println("ITER", i)
	}
	c.Close()
	c, err := Join(ctx, cfg)
	if err != nil {
		helperFail(err)
	}
	one, _ := tensordict.FromSlice([]float64{1})
	y, err := c.Allreduce(ctx, one, Sum)
	if err != nil {
		helperFail(err)
	}
	v, _ := tensordict.Values[float64](y)
	fmt.Println("REJOINED", v[0])
	c.Close()
}

func startRanks(t *testing.T, role string, tr Transport, addr, dir string, size int, ranks ...int) []*proctest.Proc {
	t.Helper()
	ps := make([]*proctest.Proc, len(ranks))
	for i, r := range ranks {
		ps[i] = proctest.Start(t, envRole+"="+role, envRank+"="+strconv.Itoa(r), envSize+"="+strconv.Itoa(size),
			envAddr+"="+addr, envTransport+"="+string(tr), envDir+"="+dir)
	}
	return ps
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// TestProcess_Collectives: ranks as processes, on both transports.
func TestProcess_Collectives(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) {
			ps := startRanks(t, "check", tr, freeAddr(t), t.TempDir(), 3, seq(3)...)
			for _, p := range ps {
				if got := p.Expect(t, "JOINED"); got != string(tr) {
					t.Fatalf("%s joined with %s, want %s", p.Name(), got, tr)
				}
			}
			for _, p := range ps {
				p.Expect(t, "OK")
				if err := p.WaitFor(30 * time.Second); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestProcess_DotProduct runs the dot-product test of every adjoint with
// the ranks as processes: 3 ranks through shared mappings, 4 over TCP.
func TestProcess_DotProduct(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tc := range []struct {
		tr Transport
		n  int
	}{{SHM, 3}, {TCP, 4}} {
		t.Run(name(tc.tr, tc.n), func(t *testing.T) {
			ps := startRanks(t, "dot", tc.tr, freeAddr(t), t.TempDir(), tc.n, seq(tc.n)...)
			sums := map[string][2]float64{}
			for _, p := range ps {
				p.Expect(t, "DOTS DONE")
				for _, line := range strings.Split(p.Output(), "\n") {
					var name string
					var l, r float64
					if _, err := fmt.Sscanf(line, "DOT %s %g %g", &name, &l, &r); err == nil {
						s := sums[name]
						sums[name] = [2]float64{s[0] + l, s[1] + r}
					}
				}
			}
			if len(sums) != len(adjCases(tc.n)) {
				t.Fatalf("%d cases reported, want %d", len(sums), len(adjCases(tc.n)))
			}
			for name, s := range sums {
				if math.Abs(s[0]-s[1]) > 1e-10*max(1, math.Abs(s[0])) || s[0] == 0 {
					t.Errorf("%s: sum <A(x), y> = %.15g, sum <x, A*(y)> = %.15g", name, s[0], s[1])
				}
			}
		})
	}
}

// TestProcess_RankKilled kills a rank with SIGKILL in the middle of a run
// of allreduces: every other rank's allreduce fails with ErrPeerLost (or
// ErrAborted) well within its 20 s deadline, none hangs, and the survivors
// and a new rank 2 then form a new communicator on the same rendezvous.
func TestProcess_RankKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) { killMidLoop(t, tr, "", 3) })
	}
}

// killMidLoop starts 4 ranks in the "loop" role on tr running op (helperLoop's;
// "": allreduce), waits until each has done iters iterations, then
// kills one and has the others rejoin (killAndRejoin).
func killMidLoop(t *testing.T, tr Transport, op string, iters int) {
	t.Helper()
	addr, dir := freeAddr(t), t.TempDir()
	ps := make([]*proctest.Proc, 4)
	for r := range ps {
		ps[r] = proctest.Start(t, envRole+"=loop", envRank+"="+strconv.Itoa(r), envSize+"=4",
			envAddr+"="+addr, envTransport+"="+string(tr), envDir+"="+dir, envOp+"="+op)
	}
	for _, p := range ps {
		p.Expect(t, "JOINED")
	}
	for _, p := range ps {
		p.Expect(t, fmt.Sprintf("ITER %d", iters))
	}
	killAndRejoin(t, ps, tr, addr, dir)
}

// killAndRejoin kills rank 2 of the "loop" ranks ps with SIGKILL: every
// other rank's call must fail with ErrPeerLost (or ErrAborted) well within
// its 20 s deadline, none hanging; then the survivors and a new rank 2
// form a new communicator on the same rendezvous, whose allreduce works.
func killAndRejoin(t *testing.T, ps []*proctest.Proc, tr Transport, addr, dir string) {
	t.Helper()
	killRank(t, ps, 2, "peer_lost", "aborted")
	// A new rank 2 joins the survivors' new communicator.
	ps[2] = startRanks(t, "check-rejoin", tr, addr, dir, 4, 2)[0]
	for i, p := range ps {
		if i == 2 {
			p.Expect(t, "JOINED")
			p.Expect(t, "REJOINED 4")
			continue
		}
		if got := p.Expect(t, "REJOINED"); got != "4" {
			t.Fatalf("rank %d: the new communicator's allreduce gave %s, want 4", i, got)
		}
	}
}

// TestProcess_SharedRankKilled: the same with shared buffers (Comm.Alloc),
// whose Allreduce runs in place in the ranks' buffers and whose Allgather
// reads exposed inputs: a rank killed mid-run fails every other rank's
// call with ErrPeerLost or ErrAborted, none waits on the dead rank's
// phase, and the survivors and a new rank form a new communicator.
func TestProcess_SharedRankKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, op := range []string{"alloc-allreduce", "alloc-allgather"} {
		t.Run(op, func(t *testing.T) { killMidLoop(t, SHM, op, 3) })
	}
}

// TestProcess_P2PRankKilled: ranks passing messages around a ring with
// Isend and Recv (through the inboxes on SHM: small ones and pipelined
// ones), one of them killed with SIGKILL: every other rank's call fails
// with ErrPeerLost or ErrAborted, none waits for the dead rank's answer or
// message, and the survivors and a new rank form a new communicator.
func TestProcess_P2PRankKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	for _, tr := range transports() {
		t.Run(string(tr), func(t *testing.T) { killMidLoop(t, tr, "p2p-ring", 5) })
	}
}

// killRank kills rank victim of the "loop" ranks ps with SIGKILL and checks
// that every other rank's call fails, within 30 s, as one of want says
// (helperLoop's ERR line: peer_lost, aborted, deadline, other).
func killRank(t *testing.T, ps []*proctest.Proc, victim int, want ...string) {
	t.Helper()
	ps[victim].Kill()
	for i, p := range ps {
		if i == victim {
			continue
		}
		line, err := p.Line("ERR", 30*time.Second)
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
		var what string
		var ms int
		fmt.Sscan(line, &what, &ms)
		if !slices.Contains(want, what) {
			t.Fatalf("rank %d: %s, want one of %v", i, line, want)
		}
		t.Logf("rank %d: failed after %d ms: %s", i, ms, what)
	}
}

// TestProcess_WrongTokenFailsEveryRankFast starts ranks as processes whose
// Config.Token differ, or that have none, with no deadline on Join: every
// rank fails within seconds with ErrUnauthenticated (and
// rpc.ErrUnauthenticated), saying so. Before, a rank refused for its token
// retried it as a network error, for ever without a deadline ("i/o
// timeout" with one), and the others waited for it.
func TestProcess_WrongTokenFailsEveryRankFast(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tokens []string // per rank; "-": none
	}{
		{"a rank's token wrong", []string{"good", "good", "bad"}},
		{"rank 0's token wrong", []string{"bad", "good"}},
		{"a rank without a token", []string{"good", "-"}},
		{"rank 0 without a token", []string{"-", "good"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := freeAddr(t)
			size := len(tc.tokens)
			ps := make([]*proctest.Proc, size)
			start := time.Now()
			for r, tok := range tc.tokens {
				env := []string{envRole + "=join", envRank + "=" + strconv.Itoa(r), envSize + "=" + strconv.Itoa(size),
					envAddr + "=" + addr, envTransport + "=tcp"}
				if tok != "-" {
					env = append(env, envToken+"="+tok)
				}
				ps[r] = proctest.Start(t, env...)
				if r == 1 && size > 2 {
					time.Sleep(200 * time.Millisecond) // the last rank comes after the others
				}
			}
			for r, p := range ps {
				line, err := p.Line("JOINERR", 15*time.Second)
				if err != nil {
					t.Fatalf("rank %d did not fail within 15 s of the start: %v", r, err)
				}
				t.Logf("rank %d: %s", r, line)
				if !strings.HasPrefix(line, "unauthenticated=true rpc=true ") {
					t.Errorf("rank %d: %s; want ErrUnauthenticated and rpc.ErrUnauthenticated", r, line)
				}
				if !strings.Contains(line, "Config.Token") || strings.Contains(line, "i/o timeout") {
					t.Errorf("rank %d: %s; want it to say the tokens differ", r, line)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("every rank failed only after %v", d)
			}
		})
	}
}
