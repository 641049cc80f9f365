// Command regression is mpi4torch's data-parallel linear regression
// example in Go, on package collective: every rank holds a share of the
// data points, the loss has two Allreduce calls (one averaging the
// parameters, one summing the ranks' losses), and the gradient comes from
// a backward pass across the ranks (collective.Tape). The program checks
// every rank's gradient against the gradient of the same loss computed in
// one process, to 1e-6.
//
//	go run ./examples/regression [--ranks 4] [--points 10000] [--transport shm|tcp]
//
// It starts --ranks copies of itself as processes (the ranks), which form a
// communicator on a free loopback port (collective.Join), compute the loss
// and its gradient, and print them; it then prints each rank's gradient
// next to the single-process one and exits with status 1 if one differs.
//
// The model: y = (p2*x + p1)*x + p0, data generated with p = (0.1, 1, -2)
// at x uniform in [0, 2), split into contiguous shares as mpi4torch splits
// them; the gradient is taken at p = (0, 1, 2). Under the convention that
// the global loss is the sum of the ranks' losses, each rank's loss is
// Allreduce(local loss), the ranks' parameters are averaged by
// Allreduce(params)/size, and each rank's gradient equals the
// single-process gradient of sum over all points of (y - f(x, p))^2.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Environment of a rank process.
const (
	envRank = "TENSORWIRE_REGRESSION_RANK"
	envArgs = "TENSORWIRE_REGRESSION_ARGS" // size,points,addr,transport
)

var genParams = []float64{0.1, 1.0, -2.0}

func model(x float64, p []float64) float64 { return (p[2]*x+p[1])*x + p[0] }

// data returns all the points, the same in every process.
func data(points int) (xs, ys []float64) {
	rng := rand.New(rand.NewPCG(42, 0))
	xs, ys = make([]float64, points), make([]float64, points)
	for i := range xs {
		xs[i] = 2 * rng.Float64()
		ys[i] = model(xs[i], genParams)
	}
	return xs, ys
}

// share returns rank's contiguous share of n points, as mpi4torch splits.
func share(n, size, rank int) (lo, hi int) {
	chunk, rest := n/size, n%size
	if rank < rest {
		chunk++
		lo = chunk * rank
	} else {
		lo = chunk*rank + rest
	}
	return lo, lo + chunk
}

// lossGrad returns sum of (y - f(x, p))^2 over the points and its gradient
// in p.
func lossGrad(xs, ys, p []float64) (float64, []float64) {
	var l float64
	g := make([]float64, 3)
	for i, x := range xs {
		r := ys[i] - model(x, p)
		l += r * r
		g[0] += -2 * r
		g[1] += -2 * r * x
		g[2] += -2 * r * x * x
	}
	return l, g
}

// result is what a rank prints.
type result struct {
	Rank int       `json:"rank"`
	Loss float64   `json:"loss"`
	Grad []float64 `json:"grad"`
}

func main() {
	if os.Getenv(envRank) != "" {
		if err := rank(); err != nil {
			fmt.Fprintln(os.Stderr, "regression rank:", err)
			os.Exit(1)
		}
		return
	}
	ranks := flag.Int("ranks", 4, "number of ranks (processes)")
	points := flag.Int("points", 10000, "data points, split between the ranks")
	transport := flag.String("transport", "", "shm or tcp (default: shared mappings when they work)")
	flag.Parse()
	ok, err := run(os.Stdout, *ranks, *points, *transport)
	if err != nil {
		fmt.Fprintln(os.Stderr, "regression:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run starts the ranks, collects their gradients and checks them.
func run(out *os.File, ranks, points int, transport string) (bool, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return false, err
	}
	addr := l.Addr().String()
	l.Close()
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	type proc struct {
		cmd *exec.Cmd
		out strings.Builder
	}
	procs := make([]*proc, ranks)
	for r := range ranks {
		p := &proc{cmd: exec.Command(exe, os.Args[1:]...)}
		p.cmd.Env = append(os.Environ(), envRank+"="+strconv.Itoa(r),
			fmt.Sprintf("%s=%d,%d,%s,%s", envArgs, ranks, points, addr, transport))
		p.cmd.Stdout, p.cmd.Stderr = &p.out, os.Stderr
		if err := p.cmd.Start(); err != nil {
			return false, err
		}
		procs[r] = p
	}
	results := make([]result, ranks)
	for r, p := range procs {
		if err := p.cmd.Wait(); err != nil {
			return false, fmt.Errorf("rank %d: %v", r, err)
		}
		if err := json.Unmarshal([]byte(p.out.String()), &results[r]); err != nil {
			return false, fmt.Errorf("rank %d printed %q: %v", r, p.out.String(), err)
		}
	}
	xs, ys := data(points)
	wantLoss, want := lossGrad(xs, ys, []float64{0, 1, 2})
	fmt.Fprintf(out, "single process: loss %.10g, gradient %.10g\n", wantLoss, want)
	ok := true
	for _, res := range results {
		verdict := "ok"
		for k := range want {
			if math.Abs(res.Grad[k]-want[k]) > 1e-6*max(1, math.Abs(want[k])) {
				verdict, ok = "DIFFERS", false
			}
		}
		if math.Abs(res.Loss-wantLoss) > 1e-6*max(1, math.Abs(wantLoss)) {
			verdict, ok = "LOSS DIFFERS", false
		}
		fmt.Fprintf(out, "rank %d:         loss %.10g, gradient %.10g  %s\n", res.Rank, res.Loss, res.Grad, verdict)
	}
	return ok, nil
}

// rank is one rank: join, compute the loss on the tape, go back.
func rank() error {
	r, _ := strconv.Atoi(os.Getenv(envRank))
	args := strings.Split(os.Getenv(envArgs), ",")
	if len(args) != 4 {
		return fmt.Errorf("%s=%q", envArgs, os.Getenv(envArgs))
	}
	size, _ := strconv.Atoi(args[0])
	points, _ := strconv.Atoi(args[1])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := collective.Join(ctx, collective.Config{Rank: r, Size: size, Addr: args[2], Transport: collective.Transport(args[3])})
	if err != nil {
		return err
	}
	defer c.Close()

	all, ally := data(points)
	lo, hi := share(points, size, r)
	xs, ys := all[lo:hi], ally[lo:hi]

	tp := collective.NewTape(c)
	p0, _ := tensordict.FromSlice([]float64{0, 1, 2})
	params := tp.Leaf(p0)

	// Average the initial parameters, to bring every rank onto the same page.
	summed, err := tp.Allreduce(ctx, params, collective.Sum)
	if err != nil {
		return err
	}
	sv, _ := tensordict.Values[float64](summed.Value())
	avg := make([]float64, 3)
	for k := range avg {
		avg[k] = sv[k] / float64(size)
	}
	avgT, _ := tensordict.FromSlice(avg)
	p := tp.Func("divide", []*collective.Var{summed}, []*tensordict.Tensor{avgT},
		func(ctx context.Context, g []*tensordict.Tensor) ([]*tensordict.Tensor, error) {
			gv, _ := tensordict.Values[float64](g[0])
			for k := range gv {
				gv[k] /= float64(size)
			}
			t, err := tensordict.FromSlice(gv)
			return []*tensordict.Tensor{t}, err
		})[0]

	// This rank's loss, and its gradient written by hand.
	l, dl := lossGrad(xs, ys, avg)
	lT, _ := tensordict.FromSlice([]float64{l})
	local := tp.Func("local loss", []*collective.Var{p}, []*tensordict.Tensor{lT},
		func(ctx context.Context, g []*tensordict.Tensor) ([]*tensordict.Tensor, error) {
			gv, _ := tensordict.Values[float64](g[0])
			out := make([]float64, 3)
			for k := range out {
				out[k] = gv[0] * dl[k]
			}
			t, err := tensordict.FromSlice(out)
			return []*tensordict.Tensor{t}, err
		})[0]

	// Sum the ranks' losses.
	loss, err := tp.Allreduce(ctx, local, collective.Sum)
	if err != nil {
		return err
	}
	if err := tp.Backward(ctx, loss, nil); err != nil {
		return err
	}
	lv, _ := tensordict.Values[float64](loss.Value())
	gv, _ := tensordict.Values[float64](params.Grad())
	return json.NewEncoder(os.Stdout).Encode(result{Rank: r, Loss: lv[0], Grad: gv})
}
