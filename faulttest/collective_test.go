package faulttest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/netns"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Collectives across hosts: each rank of a communicator is this test
// binary re-executed on a host of its own (the "rank" role), using only
// collective's public API, so the ranks exchange over TCP between
// separate addresses. The hosts share a kernel (and so the identity Join
// compares), so each rank gets a shared folder of its own (-shm), which
// makes Join choose TCP, as ranks on separate machines do; every rank
// checks it did.
//
// A rank prints, one line per event:
//
//	JOINED tcp                     formed a communicator
//	CHECKED                        every collective and adjoint checked (mode check)
//	ITER i                         allreduce i of the loop gave the right sum (mode loop)
//	FAIL kind start_us end_us msg  a loop allreduce failed: kind is peer_lost,
//	                               aborted, deadline or other; start and end Unix µs
//	REJOINED v                     a new communicator formed; its allreduce of
//	                               ones gave v (the size)
//
// and exits 0 once done, non-zero (after "BAD what") if a result is wrong.

// rankPort is where rank 0 listens, at its host's address.
const rankPort = 29500

func init() { roles["rank"] = runRank }

// runRank is the rank role.
func runRank(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rank", flag.ContinueOnError)
	rank := fs.Int("rank", 0, "this rank")
	size := fs.Int("size", 4, "ranks")
	addr := fs.String("addr", "", "rank 0's address")
	shm := fs.String("shm", "", "this rank's shared folder")
	tokenFile := fs.String("token-file", "", "the shared secret")
	mode := fs.String("mode", "check", "check: collectives and adjoints, checked; loop: allreduces until one fails, then join again; rejoin: join, allreduce once, check")
	opTimeout := fs.Duration("op-timeout", 20*time.Second, "each loop allreduce's deadline")
	elems := fs.Int("elems", 1<<20, "float32 elements of a loop allreduce")
	if err := fs.Parse(args); err != nil {
		return err
	}
	token, err := nodeproc.ReadToken(*tokenFile)
	if err != nil {
		return err
	}
	cfg := collective.Config{Rank: *rank, Size: *size, Addr: *addr, ShmDir: *shm, Token: token}
	join := func() (*collective.Comm, error) {
		jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		c, err := collective.Join(jctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("join: %w", err)
		}
		fmt.Println("JOINED", c.Transport())
		return c, nil
	}
	c, err := join()
	if err != nil {
		return err
	}
	if *mode == "loop" {
		if err := rankLoop(ctx, c, *elems, *opTimeout); err != nil {
			fmt.Println("BAD", err)
			return err
		}
		c.Close()
		if c, err = join(); err != nil {
			return err
		}
	}
	defer c.Close()
	if *mode != "check" {
		one, _ := tensordict.FromSlice([]float64{1})
		y, err := c.Allreduce(ctx, one, collective.Sum)
		if err != nil {
			return fmt.Errorf("the new communicator's allreduce: %w", err)
		}
		v, _ := tensordict.Values[float64](y)
		fmt.Println("REJOINED", v[0])
	}
	if err := rankCheck(ctx, c); err != nil {
		fmt.Println("BAD", err)
		return err
	}
	fmt.Println("CHECKED")
	return nil
}

// rankLoop allreduces elems float32 (rank+1 in every element) until a call
// fails, checking every sum, and prints the failure; it returns an error
// if a sum is wrong.
func rankLoop(ctx context.Context, c *collective.Comm, elems int, opTimeout time.Duration) error {
	v := make([]float32, elems)
	for i := range v {
		v[i] = float32(c.Rank() + 1)
	}
	x, _ := tensordict.FromSlice(v)
	y, _ := tensordict.Zeros(memmap.Float32, elems)
	want := float32(c.Size() * (c.Size() + 1) / 2)
	for i := 0; ctx.Err() == nil; i++ {
		start := time.Now()
		opCtx, cancel := context.WithTimeout(ctx, opTimeout)
		err := c.AllreduceInto(opCtx, y, x, collective.Sum)
		cancel()
		end := time.Now()
		if err != nil {
			kind := "other"
			switch {
			case errors.Is(err, collective.ErrPeerLost):
				kind = "peer_lost"
			case errors.Is(err, collective.ErrAborted):
				kind = "aborted"
			case errors.Is(err, context.DeadlineExceeded):
				kind = "deadline"
			}
			fmt.Printf("FAIL %s %d %d %s\n", kind, start.UnixMicro(), end.UnixMicro(), strings.ReplaceAll(err.Error(), "\n", " "))
			return nil
		}
		got, _ := tensordict.Values[float32](y)
		for _, j := range []int{0, elems / 3, elems - 1} {
			if got[j] != want {
				return fmt.Errorf("allreduce %d: element %d is %v, want %v", i, j, got[j], want)
			}
		}
		fmt.Println("ITER", i)
	}
	return ctx.Err()
}

// rankCheck runs collectives whose results every rank knows and checks
// them, then the dot-product test of the adjoints: the sum over ranks of
// <A(x), y> must equal the sum over ranks of <x, A*(y)>, with x and y
// random and different on every rank.
func rankCheck(ctx context.Context, c *collective.Comm) error {
	n, me := c.Size(), c.Rank()
	// Allreduce, by recursive doubling (1 KiB) and by ring (4 MiB).
	for _, elems := range []int{256, 1 << 20} {
		v := make([]float32, elems)
		for i := range v {
			v[i] = float32(me + i%7)
		}
		x, _ := tensordict.FromSlice(v)
		y, err := c.Allreduce(ctx, x, collective.Sum)
		if err != nil {
			return fmt.Errorf("allreduce of %d: %w", elems, err)
		}
		got, _ := tensordict.Values[float32](y)
		for i, g := range got {
			if want := float32(n*(n-1)/2 + n*(i%7)); g != want {
				return fmt.Errorf("allreduce of %d: element %d is %v, want %v", elems, i, g, want)
			}
		}
	}
	// Allgather with a different length on every rank.
	mine := make([]int64, 2*(me+1))
	for i := range mine {
		mine[i] = int64(100*me + i/2)
	}
	x, _ := tensordict.FromSlice(mine, me+1, 2)
	g, err := c.Allgather(ctx, x, 0)
	if err != nil {
		return fmt.Errorf("allgather: %w", err)
	}
	gv, _ := tensordict.Values[int64](g)
	k := 0
	for r := range n {
		for i := range r + 1 {
			for range 2 {
				if gv[k] != int64(100*r+i) {
					return fmt.Errorf("allgather: element %d is %d, want %d", k, gv[k], 100*r+i)
				}
				k++
			}
		}
	}
	// Bcast from the last rank.
	b, _ := tensordict.FromSlice([]float64{float64(me), 7})
	bb, err := c.Bcast(ctx, b, n-1)
	if err != nil {
		return fmt.Errorf("bcast: %w", err)
	}
	if bv, _ := tensordict.Values[float64](bb); bv[0] != float64(n-1) || bv[1] != 7 {
		return fmt.Errorf("bcast from rank %d gave %v", n-1, bv)
	}
	// The adjoints.
	for i, ac := range adjointCases(n) {
		lhs, rhs, err := ac.dot(ctx, c, i)
		if err != nil {
			return fmt.Errorf("adjoint of %s: %w", ac.name, err)
		}
		s, _ := tensordict.FromSlice([]float64{lhs, rhs})
		sum, err := c.Allreduce(ctx, s, collective.Sum)
		if err != nil {
			return fmt.Errorf("adjoint of %s: summing the dot products: %w", ac.name, err)
		}
		sv, _ := tensordict.Values[float64](sum)
		if math.Abs(sv[0]-sv[1]) > 1e-10*max(1, math.Abs(sv[0])) || sv[0] == 0 {
			return fmt.Errorf("adjoint of %s: sum <A(x), y> = %.15g, sum <x, A*(y)> = %.15g", ac.name, sv[0], sv[1])
		}
		fmt.Printf("DOT %s %.15g %.15g\n", ac.name, sv[0], sv[1])
	}
	return nil
}

// adjointCase is an operation on a tape, with the shape of rank r's input.
type adjointCase struct {
	name  string
	shape func(r int) []int
	fwd   func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error)
}

func adjointCases(n int) []adjointCase {
	fixed := func(s ...int) func(int) []int { return func(int) []int { return s } }
	uneven := func(r int) []int { return []int{r + 1, 3} }
	counts := make([]int, n) // uneven pieces of 2n rows
	for r := range counts {
		counts[r] = 2
	}
	counts[0], counts[n-1] = 1, 3
	return []adjointCase{
		{"allreduce", fixed(5, 3), func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Allreduce(ctx, x, collective.Sum)
		}},
		{"bcast(root 1)", fixed(5, 3), func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Bcast(ctx, x, 1)
		}},
		{"reduce(root 2)", fixed(5, 3), func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Reduce(ctx, x, collective.Sum, 2)
		}},
		{"allgather", uneven, func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Allgather(ctx, x, 0)
		}},
		{"gather(root 3)", uneven, func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Gather(ctx, x, 0, 3%n)
		}},
		{"scatter(root 2)", fixed(2*n, 3), func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Scatter(ctx, x, 0, counts, 2%n)
		}},
		{"reduce-scatter", fixed(2*n, 3), func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.ReduceScatter(ctx, x, collective.Sum, 0, counts)
		}},
		{"alltoall", func(r int) []int { return []int{r + 1, 2 * n} }, func(ctx context.Context, tp *collective.Tape, x *collective.Var) (*collective.Var, error) {
			return tp.Alltoall(ctx, x, 0, 1, nil)
		}},
	}
}

// dot runs case i's forward and backward on this rank and returns
// <A(x), y> and <x, A*(y)> for its own x and y.
func (ac adjointCase) dot(ctx context.Context, c *collective.Comm, i int) (lhs, rhs float64, err error) {
	rng := rand.New(rand.NewPCG(uint64(c.Rank())+1, uint64(i)))
	tp := collective.NewTape(c)
	x := tp.Leaf(randFloat64(rng, ac.shape(c.Rank())...))
	y, err := ac.fwd(ctx, tp, x)
	if err != nil {
		return 0, 0, err
	}
	var seed *tensordict.Tensor
	if y != nil && y.Value() != nil { // Gather off the root gives nothing
		seed = randFloat64(rng, y.Value().Shape()...)
		lhs = dot64(y.Value(), seed)
	}
	if err := tp.Backward(ctx, y, seed); err != nil {
		return 0, 0, err
	}
	if x.Grad() != nil {
		rhs = dot64(x.Value(), x.Grad())
	}
	return lhs, rhs, nil
}

func randFloat64(rng *rand.Rand, shape ...int) *tensordict.Tensor {
	n := 1
	for _, s := range shape {
		n *= s
	}
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.Float64()*2 - 1
	}
	t, _ := tensordict.FromSlice(v, shape...)
	return t
}

func dot64(a, b *tensordict.Tensor) float64 {
	av, _ := tensordict.Values[float64](a)
	bv, _ := tensordict.Values[float64](b)
	s := 0.0
	for i := range av {
		s += av[i] * bv[i]
	}
	return s
}

// ranks is a communicator's ranks as processes, one per host.
type ranks struct {
	c     *cluster
	hosts []*netns.Host
	shm   []string
	addr  string
	procs []*proctest.Proc
}

// startRanks puts n ranks on n hosts of their own, in mode, and waits
// until they have formed a communicator over TCP.
func startRanks(t *testing.T, c *cluster, n int, mode string) *ranks {
	t.Helper()
	rs := &ranks{c: c}
	for r := range n {
		rs.hosts = append(rs.hosts, c.host(fmt.Sprintf("rank%d", r)))
		rs.shm = append(rs.shm, t.TempDir())
	}
	rs.addr = fmt.Sprintf("%s:%d", rs.hosts[0].Addr(), rankPort)
	for r := range n {
		rs.procs = append(rs.procs, rs.start(t, r, mode))
	}
	rs.expectJoined(t, rs.procs...)
	return rs
}

// start starts rank r on its host in mode.
func (rs *ranks) start(t *testing.T, r int, mode string) *proctest.Proc {
	t.Helper()
	return rs.c.helper(rs.hosts[r], "rank", fmt.Sprintf("rank %d (%s)", r, mode), "-rank", itoa(r), "-size", itoa(len(rs.hosts)),
		"-addr", rs.addr, "-shm", rs.shm[r], "-token-file", rs.c.token, "-mode", mode)
}

// expectJoined waits for each of ps to print JOINED and checks it runs
// over TCP.
func (rs *ranks) expectJoined(t *testing.T, ps ...*proctest.Proc) {
	t.Helper()
	for _, p := range ps {
		line, err := p.Line("JOINED", 2*time.Minute)
		if err != nil {
			t.Fatalf("%s: %v\n%s", p.Name(), err, p.Stderr())
		}
		if line != string(collective.TCP) {
			t.Fatalf("%s joined with transport %q, want tcp (ranks on separate hosts)", p.Name(), line)
		}
	}
}

// TestCollectiveAcrossHosts: four ranks, each on a host of its own, run
// allreduces (recursive doubling and ring), an uneven allgather, a bcast
// and the dot-product test of eight adjoints over TCP, and check every
// result.
func TestCollectiveAcrossHosts(t *testing.T) {
	c := newCluster(t)
	rs := startRanks(t, c, 4, "check")
	dots := map[string]string{}
	for _, p := range rs.procs {
		if err := p.WaitFor(2 * time.Minute); err != nil {
			t.Fatalf("%s: %v\n%s\n%s", p.Name(), err, p.Output(), p.Stderr())
		}
		if !strings.Contains(p.Output(), "\nCHECKED") {
			t.Fatalf("%s exited without CHECKED:\n%s", p.Name(), p.Output())
		}
		for _, line := range strings.Split(p.Output(), "\n") {
			if rest, ok := strings.CutPrefix(line, "DOT "); ok {
				name := rest[:strings.LastIndex(rest[:strings.LastIndex(rest, " ")], " ")]
				if prev, ok := dots[name]; ok && prev != rest {
					t.Errorf("the ranks disagree on the sums of %s: %q and %q", name, prev, rest)
				}
				dots[name] = rest
			}
		}
	}
	if len(dots) != len(adjointCases(4)) {
		t.Errorf("%d adjoints checked, want %d: %v", len(dots), len(adjointCases(4)), dots)
	}
	figures(t, "hosts", 4, "transport", "tcp", "adjoints_checked", len(dots))
}

// failure is a rank's FAIL line.
type failure struct {
	kind       string
	start, end time.Time
	msg        string
}

func parseFailure(line string) (failure, error) {
	var f failure
	var s, e int64
	if _, err := fmt.Sscanf(line, "%s %d %d", &f.kind, &s, &e); err != nil {
		return f, fmt.Errorf("FAIL %s: %v", line, err)
	}
	f.start, f.end = time.UnixMicro(s), time.UnixMicro(e)
	if i := strings.Index(line, " "); i >= 0 {
		f.msg = line[i+1:]
	}
	return f, nil
}

// TestCollectiveAcrossHosts_RankLost: four ranks on four hosts allreduce
// 4 MiB again and again over TCP, each call with a 20 s deadline, and one
// rank is lost in the middle: killed with SIGKILL, its host cut off the
// network, or frozen with SIGSTOP. Every other rank's allreduce fails with
// ErrPeerLost (or ErrAborted) within its deadline, none hangs; then the
// ranks close and join again on the same rendezvous (the killed one
// restarted, the cut one once its host is back, the frozen one once it
// runs again), and the new communicator's collectives and adjoints check
// out.
func TestCollectiveAcrossHosts_RankLost(t *testing.T) {
	const opTimeout = 20 * time.Second // the loop's, in runRank
	for _, tc := range []struct {
		name string
		lost int
		how  string // kill, cut or freeze
	}{
		// A killed rank's sockets close at once; a silent host or process
		// is found by rpc's keep-alive (5 x 1 s).
		{"killed", 2, "kill"},
		{"partitioned", 3, "cut"},
		{"rendezvous partitioned", 0, "cut"},
		{"frozen", 1, "freeze"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t)
			rs := startRanks(t, c, 4, "loop")
			for _, p := range rs.procs {
				if _, err := p.Line("ITER 3", time.Minute); err != nil {
					t.Fatalf("%s: %v\n%s", p.Name(), err, p.Stderr())
				}
			}
			lostAt := time.Now()
			switch tc.how {
			case "kill":
				lostAt = rs.procs[tc.lost].Kill()
			case "cut":
				if err := rs.hosts[tc.lost].Disconnect(); err != nil {
					t.Fatal(err)
				}
			case "freeze":
				if err := syscall.Kill(rs.procs[tc.lost].Pid(), syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
			}
			// Every rank still running reports its failure, in time.
			var after []string
			failed := func(r int) {
				t.Helper()
				p := rs.procs[r]
				line, err := p.Line("FAIL", opTimeout+30*time.Second)
				if err != nil {
					t.Fatalf("rank %d: no failure after rank %d was lost: %v\n%s", r, tc.lost, err, p.Stderr())
				}
				f, err := parseFailure(line)
				if err != nil {
					t.Fatal(err)
				}
				took := f.end.Sub(lostAt)
				if f.start.After(lostAt) {
					took = f.end.Sub(f.start)
				}
				after = append(after, fmt.Sprintf("%d:%s:%v", r, f.kind, took.Round(time.Millisecond)))
				t.Logf("rank %d: %s %v after the loss: %s", r, f.kind, took.Round(time.Millisecond), f.msg)
				if f.kind != "peer_lost" && f.kind != "aborted" {
					t.Errorf("rank %d failed with %s (%s), want peer_lost or aborted", r, f.kind, f.msg)
				}
				if r != tc.lost && (f.end.Sub(f.start) > opTimeout || took > opTimeout) {
					t.Errorf("rank %d: failed %v after the loss, %v after its call started; its deadline is %v", r, took, f.end.Sub(f.start), opTimeout)
				}
			}
			for r := range rs.procs {
				if r != tc.lost || tc.how == "cut" {
					failed(r)
				}
			}
			// The loss heals: a new rank on the killed one's host, the cut
			// host back on the network, the frozen rank running again.
			switch tc.how {
			case "kill":
				rs.procs[tc.lost] = rs.start(t, tc.lost, "rejoin")
			case "cut":
				if err := rs.hosts[tc.lost].Reconnect(); err != nil {
					t.Fatal(err)
				}
			case "freeze":
				if err := syscall.Kill(rs.procs[tc.lost].Pid(), syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
				failed(tc.lost) // it finds the others gone
			}
			healed := time.Now()
			rs.expectJoined(t, rs.procs...) // each rank's second JOINED (the restarted one's first)
			formed := time.Since(healed).Round(time.Millisecond)
			for r, p := range rs.procs {
				got, err := p.Line("REJOINED", time.Minute)
				if err != nil {
					t.Fatalf("rank %d: %v\n%s", r, err, p.Stderr())
				}
				if got != "4" {
					t.Fatalf("rank %d: the new communicator's allreduce of ones gave %s, want 4", r, got)
				}
				if err := p.WaitFor(2 * time.Minute); err != nil || !strings.Contains(p.Output(), "\nCHECKED") {
					t.Fatalf("rank %d: the checks on the new communicator: %v\n%s\n%s", r, err, p.Output(), p.Stderr())
				}
			}
			figures(t, "lost_rank", tc.lost, "how", tc.how, "op_deadline", opTimeout,
				"failed_after", strings.Join(after, ","), "heal_to_rejoined", formed)
		})
	}
}
