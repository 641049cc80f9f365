package collective

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/python"
)

// --lang python: allreduce from Python (forward, and forward+backward
// through autograd) at each rank count, size and transport, by
// tensorwire.collective (each rank a Python process with its sidecar,
// docs/collective.md "From Python"), by torch.distributed's gloo backend
// (dist.all_reduce; torch.distributed.nn.functional.all_reduce for
// forward+backward) over loopback TCP, and by mpi4torch where it imports,
// side by side with the same operations from Go ranks in the same run:
// the "python - go" column is the Python overhead per call. Each Python
// rank is python -m tensorwire._bench_collective (this build's client,
// extracted to a temporary folder).

// pyOptions are the flags of --lang python.
type pyOptions struct {
	python    string
	systems   []string
	sidecar   string
	extracted string
}

var allSystems = []string{"tensorwire", "gloo", "mpi4torch"}

func runPython(ctx context.Context, o options, po pyOptions, env bench.Env) error {
	env.Stderr = &lockedWriter{w: env.Stderr}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	po, cleanup, err := setupPython(po, env, exe, true)
	if err != nil {
		return err
	}
	defer cleanup()
	res := Result{MemcpyGBps: memcpyGBps()}
	var wakeLine string
	res.Wake, wakeLine = benchkit.WakeReference()
	var notes []string
	// Go's figures first, for the overhead column. Its forward+backward
	// allocates a new output and seed each step, as a torch autograd step
	// (the Python and gloo lines) does: the buffer-reusing variant would
	// flatter Go here.
	var goOps []string
	for _, op := range o.ops {
		if op == "allreduce-fwd-bwd" {
			op = "allreduce-fwd-bwd-alloc"
		}
		goOps = append(goOps, op)
	}
	for _, tr := range o.transports {
		for _, n := range o.ranks {
			og := o
			og.ops = goOps
			runs, err := runGroup(ctx, og, env, exe, tr, n, nil)
			if err != nil {
				return fmt.Errorf("go, %s, %d ranks: %w", tr, n, err)
			}
			for i := range runs {
				runs[i].System = "go"
				if runs[i].Op == "allreduce-fwd-bwd-alloc" {
					runs[i].Op = "allreduce-fwd-bwd"
				}
			}
			res.Runs = append(res.Runs, runs...)
		}
	}
	for _, sys := range po.systems {
		trs := o.transports
		if sys != "tensorwire" {
			trs = []string{"tcp"} // gloo's and MPI's own
		}
		for _, tr := range trs {
			for _, n := range o.ranks {
				runs, note, err := runPyGroup(ctx, o, po, env, sys, tr, n)
				if err != nil {
					return fmt.Errorf("%s, %s, %d ranks: %w", sys, tr, n, err)
				}
				if note != "" {
					notes = append(notes, note)
					break
				}
				res.Runs = append(res.Runs, runs...)
			}
		}
	}
	goP50 := map[string]float64{}
	key := func(r Line) string { return fmt.Sprint(r.Op, r.Ranks, r.Transport, r.Bytes) }
	for _, r := range res.Runs {
		if r.System == "go" {
			goP50[key(r)] = r.P50us
		}
	}
	t := report.NewTable("op", "ranks", "system", "transport", "bytes", "p50 us", "busbw GB/s", "python - go p50 us")
	for _, r := range res.Runs {
		over := ""
		if g, ok := goP50[key(r)]; ok && r.System == "tensorwire" {
			over = fmt.Sprintf("%.1f", r.P50us-g)
		}
		t.Row(r.Op, r.Ranks, r.System, r.Transport, r.Bytes, fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.3f", r.BusBW), over)
	}
	t.WriteTo(env.Stdout)
	for _, n := range notes {
		fmt.Fprintln(env.Stdout, n)
	}
	fmt.Fprintf(env.Stdout, "\nmemcpy (one core, 64 MiB, warm): %.2f GB/s\n", res.MemcpyGBps)
	fmt.Fprintln(env.Stdout, wakeLine)
	if o.json != "" {
		return report.WriteJSON(o.json, res)
	}
	return nil
}

// setupPython extracts this build's Python client to a temporary folder
// and finds a Python with numpy, msgpack and torch (po.python, or python3)
// and, with sidecar, the tensorwire binary for tensorwire's sidecars. It
// returns po with them set and a function that removes the folder; a
// missing Python or torch is ErrUsage.
func setupPython(po pyOptions, env bench.Env, exe string, sidecar bool) (pyOptions, func(), error) {
	c, err := benchkit.FindPython(po.python, "numpy, msgpack, torch")
	if err != nil {
		return po, nil, bench.Usagef("--lang python needs a Python with numpy, msgpack and torch (--python chooses it): %v", err)
	}
	po.python = c
	if sidecar && po.sidecar == "" {
		if len(env.Self) > 0 && env.Self[0] == "bench" {
			po.sidecar = exe // this program is tensorwire
		} else if p, err := exec.LookPath("tensorwire"); err == nil {
			po.sidecar = p
		} else {
			return po, nil, bench.Usagef("--lang python needs the tensorwire binary for the sidecars: --tensorwire BIN")
		}
	}
	dir, err := os.MkdirTemp("", "tensorwire-bench-collective-py-")
	if err != nil {
		return po, nil, err
	}
	if err := python.Extract(dir); err != nil {
		os.RemoveAll(dir)
		return po, nil, err
	}
	po.extracted = dir
	return po, func() { os.RemoveAll(dir) }, nil
}

// runPyGroup runs n Python ranks of sys on transport tr and returns rank
// 0's lines, or a note when sys cannot run here.
func runPyGroup(ctx context.Context, o options, po pyOptions, env bench.Env, sys, tr string, n int) ([]Line, string, error) {
	addr, err := loopbackAddr()
	if err != nil {
		return nil, "", err
	}
	sizes := sizeArgs(o.sizes)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The extracted client first; the caller's PYTHONPATH after it, where
	// an mpi4torch built outside site-packages may be.
	pythonPath := po.extracted
	if pp := os.Getenv("PYTHONPATH"); pp != "" {
		pythonPath += string(os.PathListSeparator) + pp
	}
	env0 := append(os.Environ(), "PYTHONPATH="+pythonPath, "TENSORWIRE_BIN="+po.sidecar,
		"OMP_NUM_THREADS=1", "PYTHONDONTWRITEBYTECODE=1")
	rankArgs := func(r int) []string {
		return []string{"-m", "tensorwire._bench_collective", "--system", sys,
			"--rank", strconv.Itoa(r), "--size", strconv.Itoa(n), "--addr", addr, "--transport", tr,
			"--sizes", strings.Join(sizes, ","), "--ops", strings.Join(o.ops, ",")}
	}
	if sys == "mpi4torch" {
		// Whether it imports is asked first, here: under mpirun a rank's
		// line saying it does not could be lost (mpirun forwarding the
		// output of ranks that exit at once; seen here with Open MPI 4.1).
		imp := exec.CommandContext(ctx, po.python, "-c", "import mpi4torch")
		imp.Env, imp.Dir = env0, filepath.Dir(po.extracted)
		if out, err := imp.CombinedOutput(); err != nil {
			why := strings.TrimSpace(string(out))
			if i := strings.LastIndex(why, "\n"); i >= 0 {
				why = why[i+1:] // the exception's line
			}
			return nil, fmt.Sprintf("mpi4torch: not installed (%s): it needs MPI and a C++ compiler to build", why), nil
		}
		// MPI's ranks are started by mpirun (one command, every rank).
		if mpirun, err := exec.LookPath("mpirun"); err == nil {
			cmd, out, err := startMPI(ctx, mpirun, n, env0, filepath.Dir(po.extracted), env, po.python, rankArgs(0)...)
			if err != nil {
				return nil, "", err
			}
			runs, note := readPyLines(out, env, sys)
			if err := cmd.Wait(); err != nil && note == "" {
				return runs, "", fmt.Errorf("mpirun: %w", err)
			}
			return runs, note, nil
		}
	}
	procs := n
	if sys == "mpi4torch" {
		procs = 1 // without mpirun: rank 0 says why it cannot run (COMM_WORLD's size, or no mpi4torch)
	}
	var cmds []*exec.Cmd
	var out io.Reader
	for r := range procs {
		cmd := exec.CommandContext(ctx, po.python, rankArgs(r)...)
		cmd.Env = env0
		cmd.Dir = filepath.Dir(po.extracted)
		cmd.Stderr = env.Stderr
		if r == 0 {
			if out, err = cmd.StdoutPipe(); err != nil {
				return nil, "", err
			}
		}
		if err := cmd.Start(); err != nil {
			return nil, "", err
		}
		cmds = append(cmds, cmd)
	}
	runs, note := readPyLines(out, env, sys)
	var first error
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil && first == nil {
			first = fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return runs, note, first
}

// readPyLines reads rank 0's JSON lines of sys from out: its figures, or
// the note of a line with an error (sys cannot run here).
func readPyLines(out io.Reader, env bench.Env, sys string) ([]Line, string) {
	var runs []Line
	note := ""
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r struct {
			Line
			Error string `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		if r.Error != "" {
			note = fmt.Sprintf("%s: %s", sys, r.Error)
			continue
		}
		fmt.Fprintf(env.Stderr, "python %s %s %d ranks %s %d B: p50 %.1f us, busbw %.3f GB/s\n", sys, r.Transport, r.Ranks, r.Op, r.Bytes, r.P50us, r.BusBW)
		runs = append(runs, r.Line)
	}
	return runs, note
}
