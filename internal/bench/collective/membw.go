package collective

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// The memory bandwidth bound of the shared-mapping figures (issue 29): B is
// the aggregate memory bandwidth of p processes, measured in the same run,
// each copying a buffer of its own (bytes read plus written, all p copying
// at once); the bound on an Allreduce's bus bandwidth through shared
// mappings is 2B/p, which assumes each rank reads each input byte of its
// share once and the result is read in place.

// membwBytes is the buffer each process copies: far past the caches.
const membwBytes = 64 << 20

// membwCopies is how many times each process copies it, timed.
const membwCopies = 5

// MemBW is the aggregate memory bandwidth of Procs processes copying at
// once, in GB/s (1e9 bytes a second, read plus written).
type MemBW struct {
	Procs int     `json:"procs"`
	GBps  float64 `json:"GBps"`
}

// boundGBps is the bound 2B/p on the busbw of p ranks through shared
// mappings, from the measured B of p processes (0 when not measured).
func boundGBps(bws []MemBW, p int) float64 {
	for _, b := range bws {
		if b.Procs == p {
			return 2 * b.GBps / float64(p)
		}
	}
	return 0
}

// memBW measures the aggregate bandwidth of p processes (the running
// program with --role membw): each allocates and touches its buffers and
// says so, then all are told to go at once, each copies its buffer
// membwCopies times and says how long it took. B is the bytes read and
// written by all over the longest time.
func memBW(ctx context.Context, env bench.Env, exe string, p int) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type proc struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var procs []proc
	defer func() {
		for _, pr := range procs {
			pr.in.Close()
			pr.cmd.Wait()
		}
	}()
	for range p {
		cmd := exec.CommandContext(ctx, exe, append(slices.Clone(env.Self), "--role", "membw")...)
		cmd.Stderr = env.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return 0, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		procs = append(procs, proc{cmd, in, bufio.NewScanner(out)})
	}
	for i, pr := range procs {
		if !pr.out.Scan() || pr.out.Text() != "ready" {
			return 0, fmt.Errorf("membw process %d did not get ready", i)
		}
	}
	for _, pr := range procs {
		if _, err := io.WriteString(pr.in, "go\n"); err != nil {
			return 0, err
		}
	}
	var longest time.Duration
	for i, pr := range procs {
		if !pr.out.Scan() {
			return 0, fmt.Errorf("membw process %d said nothing", i)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(pr.out.Text()), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("membw process %d: %w", i, err)
		}
		longest = max(longest, time.Duration(ns))
	}
	moved := float64(p) * membwCopies * 2 * membwBytes
	return moved / longest.Seconds() / 1e9, nil
}

// runMemBW is one --role membw process.
func runMemBW(stdin io.Reader, stdout io.Writer) error {
	a, b := make([]byte, membwBytes), make([]byte, membwBytes)
	for i := range a {
		a[i] = byte(i)
	}
	copy(b, a) // every page touched, both buffers
	fmt.Fprintln(stdout, "ready")
	if _, err := bufio.NewReader(stdin).ReadString('\n'); err != nil {
		return err
	}
	start := time.Now()
	for range membwCopies {
		copy(b, a)
		a, b = b, a
	}
	_, err := fmt.Fprintln(stdout, time.Since(start).Nanoseconds())
	return err
}

// runMemBWs measures B for every rank count of the run.
func runMemBWs(ctx context.Context, env bench.Env, exe string, ranks []int) ([]MemBW, error) {
	var out []MemBW
	for _, p := range ranks {
		gbps, err := memBW(ctx, env, exe, p)
		if err != nil {
			return nil, fmt.Errorf("memory bandwidth with %d processes: %w", p, err)
		}
		fmt.Fprintf(env.Stderr, "memory bandwidth, %d processes copying at once: %.2f GB/s (read plus written)\n", p, gbps)
		out = append(out, MemBW{Procs: p, GBps: gbps})
	}
	return out, nil
}

// runGloo runs gloo's allreduce (and forward+backward) from Python at
// every rank count and size of the run, when --gloo auto, the ranks run on
// this host and a Python with torch is at hand; otherwise it returns a
// note saying why not.
func runGloo(ctx context.Context, o options, po pyOptions, env bench.Env, exe string) ([]Line, string, error) {
	var ops []string
	for _, op := range o.ops {
		if op == "allreduce" || op == "allreduce-fwd-bwd" {
			ops = append(ops, op)
		}
	}
	if o.gloo == "off" || len(ops) == 0 {
		return nil, "", nil
	}
	if o.hosts != "local" {
		return nil, "gloo: not run (--hosts " + o.hosts + ")", nil
	}
	po, cleanup, err := setupPython(po, env, exe, false)
	if err != nil {
		return nil, fmt.Sprintf("gloo: not run: %v", err), nil
	}
	defer cleanup()
	og := o
	og.ops = ops
	var out []Line
	for _, n := range o.ranks {
		runs, note, err := runPyGroup(ctx, og, po, env, "gloo", "tcp", n)
		if err != nil {
			return nil, "", fmt.Errorf("gloo, %d ranks: %w", n, err)
		}
		if note != "" {
			return out, note, nil
		}
		for i := range runs {
			runs[i].System = "gloo"
		}
		out = append(out, runs...)
	}
	return out, "", nil
}

// figures fills in the bound columns of the Allreduce lines, ours and
// gloo's (lineBound), and the ratio to gloo's (and Open MPI's) p50 of every
// line they have a figure for.
func figures(res *Result, gloo, mpi []Line) {
	key := func(r Line) string { return fmt.Sprint(r.Op, "/", r.Ranks, "/", r.Bytes) }
	g := map[string]float64{}
	for _, r := range gloo {
		g[key(r)] = r.P50us
	}
	m := map[string]float64{}
	for _, r := range mpi {
		m[key(r)] = r.P50us
	}
	for i := range res.Runs {
		r := &res.Runs[i]
		setBound(r, lineBound(res, *r))
		if p, ok := g[key(*r)]; ok && r.P50us > 0 {
			r.VsGloo = p / r.P50us
		}
		if p, ok := m[key(*r)]; ok && r.P50us > 0 {
			r.VsMPI = p / r.P50us
		}
	}
	for i := range gloo {
		setBound(&gloo[i], lineBound(res, gloo[i]))
	}
}

// setBound gives line r the bound b on its busbw and the fraction of it
// reached, when b is known (above 0).
func setBound(r *Line, b float64) {
	if b > 0 {
		r.Bound, r.OfBound = b, r.BusBW/b
	}
}
