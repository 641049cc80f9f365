package replay

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	rb "github.com/tensorwire/tensorwire/replay"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// "tensorwire bench replay --sampler slice": slices of episodes
// (replay.Buffer.SampleSlices, in this process and through a Client over
// loopback TCP) against torchrl's SliceSampler over LazyMemmapStorage, on
// the same episodes, side by side in one run. Every slice of both is
// checked: one episode, consecutive steps, no torn step.

// sliceOptions are the flags of the slice benchmark.
type sliceOptions struct {
	sampler  string
	duration time.Duration
	capacity int
	sliceLen int
	batch    int
	obs      int
	minEp    int
	maxEp    int
	python   string
	threads  int
	json     string
	root     string
}

// wantsSlices reports whether args ask for the slice benchmark.
func wantsSlices(args []string) bool {
	for i, a := range args {
		if a == "--sampler" || a == "-sampler" {
			return i+1 < len(args) && args[i+1] == "slice"
		}
		if v, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "sampler="); ok && strings.HasPrefix(a, "-") {
			return v == "slice"
		}
	}
	return false
}

// SliceResult is one row of the slice benchmark's table (and its JSON).
type SliceResult struct {
	Impl      string  `json:"impl"`
	Slices    int64   `json:"slices"`
	Samples   int64   `json:"samples"`
	Seconds   float64 `json:"seconds"`
	SlicesPS  float64 `json:"slices_per_s"`
	Bad       int64   `json:"bad_slices"` // slices not one episode's consecutive steps, or with a torn step
	Skipped   string  `json:"skipped,omitempty"`
	Resampled int64   `json:"resampled,omitempty"`
}

// SliceRun is the slice benchmark's JSON.
type SliceRun struct {
	Date     string        `json:"date"`
	Capacity int           `json:"capacity"`
	Episodes int           `json:"episodes"`
	SliceLen int           `json:"slice_len"`
	Batch    int           `json:"batch"`
	Obs      int           `json:"obs_floats"`
	Results  []SliceResult `json:"results"`
}

func runSlices(ctx context.Context, env bench.Env, args []string) error {
	var o sliceOptions
	fs := flag.NewFlagSet("bench replay --sampler slice", flag.ContinueOnError)
	fs.StringVar(&o.sampler, "sampler", "slice", "slice: this benchmark")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "how long each implementation samples")
	fs.IntVar(&o.capacity, "capacity", 200_000, "steps in the buffer (every episode written whole, none overwritten)")
	fs.IntVar(&o.sliceLen, "slice-len", 32, "steps a slice")
	fs.IntVar(&o.batch, "batch", 256, "steps a sample (batch/slice-len slices)")
	fs.IntVar(&o.obs, "obs", 16, "float32s of a step's observation")
	fs.IntVar(&o.minEp, "min-episode", 50, "shortest episode, steps")
	fs.IntVar(&o.maxEp, "max-episode", 500, "longest episode, steps")
	fs.StringVar(&o.python, "python", "python3", "the interpreter with torchrl (its row is skipped, saying why, if it does not import)")
	fs.IntVar(&o.threads, "torch-threads", 1, "torch.set_num_threads for torchrl (0: torch's default); on a loaded machine more threads made it slower")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&o.root, "root", "", "folder for the buffers (default: the system temporary directory)")
	if err := bench.Parse(name, fs, args, env.Stdout); err != nil {
		return err
	}
	switch {
	case o.sampler != "slice":
		return usagef("--sampler %q: only slice", o.sampler)
	case o.sliceLen < 1 || o.batch%o.sliceLen != 0 || o.batch < o.sliceLen:
		return usagef("--batch %d must be a multiple of --slice-len %d", o.batch, o.sliceLen)
	case o.minEp < o.sliceLen || o.maxEp < o.minEp || o.capacity < o.maxEp || o.obs < 1:
		return usagef("want slice-len <= min-episode <= max-episode <= capacity, obs >= 1")
	}
	dir, err := os.MkdirTemp(o.root, "tensorwire-bench-slices-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Fprintf(env.Stderr, "writing %d steps of episodes of %d-%d steps\n", o.capacity, o.minEp, o.maxEp)
	lengths := episodeLengths(o)
	data, err := episodeData(o, lengths)
	if err != nil {
		return err
	}
	run := SliceRun{Date: time.Now().UTC().Format(time.RFC3339), Capacity: o.capacity, Episodes: len(lengths),
		SliceLen: o.sliceLen, Batch: o.batch, Obs: o.obs}
	buf, err := rb.Create(filepath.Join(dir, "buf"), rb.Config{Capacity: o.capacity, Schema: data.RowSchema(), TrajKey: []string{"episode"}})
	if err != nil {
		return err
	}
	defer buf.Close()
	start := 0
	for _, l := range lengths {
		part, err := data.Slice(start, start+l)
		if err != nil {
			return err
		}
		if _, err := buf.Extend(ctx, part); err != nil {
			return err
		}
		start += l
	}
	spec := rb.SliceSpec{SliceLen: o.sliceLen, NumSlices: o.batch / o.sliceLen}
	fmt.Fprintln(env.Stderr, "sampling slices: tensorwire Buffer")
	r := timeSlices(ctx, o, "tensorwire Buffer.SampleSlices (in process)", func(ctx context.Context) (*tensordict.TensorDict, rb.SliceInfo, error) {
		return buf.SampleSlices(ctx, spec)
	})
	if st, err := buf.Stats(); err == nil {
		r.Resampled = st.Resampled
	}
	run.Results = append(run.Results, r)

	fmt.Fprintln(env.Stderr, "sampling slices: tensorwire Client over loopback TCP")
	remote, err := timeRemote(ctx, o, dir, buf, spec)
	if err != nil {
		return err
	}
	run.Results = append(run.Results, remote...)

	fmt.Fprintln(env.Stderr, "sampling slices: torchrl")
	dataDir := filepath.Join(dir, "data")
	if _, err := data.Memmap(dataDir); err != nil {
		return err
	}
	run.Results = append(run.Results, timeTorchRL(ctx, o, dataDir, filepath.Join(dir, "torchrl"), false))
	run.Results = append(run.Results, timeTorchRL(ctx, o, dataDir, filepath.Join(dir, "torchrl-cached"), true))

	printSlices(env.Stdout, o, run)
	if o.json != "" {
		b, _ := json.MarshalIndent(run, "", "  ")
		if err := os.WriteFile(o.json, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// episodeLengths draws episode lengths uniformly in [minEp, maxEp] until
// they fill the capacity; the last is cut to fit (and kept only if it holds
// a slice).
func episodeLengths(o sliceOptions) []int {
	rng := rand.New(rand.NewPCG(1, 2))
	var out []int
	left := o.capacity
	for left > 0 {
		l := min(o.minEp+rng.IntN(o.maxEp-o.minEp+1), left)
		if l < o.sliceLen && len(out) > 0 {
			out[len(out)-1] += l
		} else {
			out = append(out, l)
		}
		left -= l
	}
	return out
}

// stepValue is what every float of step t of episode e's observation holds.
func stepValue(e, t int64) float32 { return float32(e*1000 + t) }

// episodeData is the episodes' steps, in order: obs, episode, step,
// reward, done.
func episodeData(o sliceOptions, lengths []int) (*tensordict.TensorDict, error) {
	n := o.capacity
	obs := make([]float32, n*o.obs)
	eps := make([]int64, n)
	st := make([]int64, n)
	rew := make([]float32, n)
	done := make([]bool, n)
	i := 0
	for e, l := range lengths {
		for t := range l {
			eps[i], st[i], rew[i], done[i] = int64(e), int64(t), float32((e*31+t*7)%13)-6, t == l-1
			for j := range o.obs {
				obs[i*o.obs+j] = stepValue(int64(e), int64(t))
			}
			i++
		}
	}
	td, err := tensordict.New(n)
	if err != nil {
		return nil, err
	}
	for key, mk := range map[string]func() (*tensordict.Tensor, error){
		"obs":     func() (*tensordict.Tensor, error) { return tensordict.FromSlice(obs, n, o.obs) },
		"episode": func() (*tensordict.Tensor, error) { return tensordict.FromSlice(eps, n) },
		"step":    func() (*tensordict.Tensor, error) { return tensordict.FromSlice(st, n) },
		"reward":  func() (*tensordict.Tensor, error) { return tensordict.FromSlice(rew, n) },
		"done":    func() (*tensordict.Tensor, error) { return tensordict.FromSlice(done, n) },
	} {
		t, err := mk()
		if err != nil {
			return nil, err
		}
		if err := td.Set(key, t); err != nil {
			return nil, err
		}
	}
	return td, nil
}

// checkSliceSample counts the slices of td that are not slice-len
// consecutive steps of one episode whose every field agrees.
func checkSliceSample(td *tensordict.TensorDict, o sliceOptions) (bad int64, err error) {
	ot, err := td.Tensor("obs")
	if err != nil {
		return 0, err
	}
	et, _ := td.Tensor("episode")
	stt, _ := td.Tensor("step")
	obs, err := tensordict.Values[float32](ot)
	if err != nil {
		return 0, err
	}
	eps, _ := tensordict.Values[int64](et)
	st, _ := tensordict.Values[int64](stt)
	L := o.sliceLen
	for s := 0; s < len(eps)/L; s++ {
		ok := true
		for i := s * L; i < (s+1)*L && ok; i++ {
			ok = eps[i] == eps[s*L] && st[i] == st[s*L]+int64(i-s*L)
			for j := range o.obs {
				ok = ok && obs[i*o.obs+j] == stepValue(eps[i], st[i])
			}
		}
		if !ok {
			bad++
		}
	}
	return bad, nil
}

// timeSlices samples with sample for the duration, checking every slice.
func timeSlices(ctx context.Context, o sliceOptions, impl string,
	sample func(context.Context) (*tensordict.TensorDict, rb.SliceInfo, error)) SliceResult {
	r := SliceResult{Impl: impl}
	if _, _, err := sample(ctx); err != nil { // warm up
		r.Skipped = err.Error()
		return r
	}
	start := time.Now()
	for time.Since(start) < o.duration && ctx.Err() == nil {
		td, _, err := sample(ctx)
		if err != nil {
			r.Skipped = err.Error()
			break
		}
		bad, err := checkSliceSample(td, o)
		if err != nil {
			r.Skipped = err.Error()
			break
		}
		r.Bad += bad
		r.Samples++
		r.Slices += int64(o.batch / o.sliceLen)
	}
	r.Seconds = time.Since(start).Seconds()
	r.SlicesPS = float64(r.Slices) / r.Seconds
	return r
}

// timeRemote serves buf on a loopback rpc server and samples slices through
// a Client, by reference (the client gathers from its own mapping; one call
// a sample, or one for eight, WithSlicesAhead) and by bytes (the node sends
// the rows).
func timeRemote(ctx context.Context, o sliceOptions, dir string, buf *rb.Buffer, spec rb.SliceSpec) ([]SliceResult, error) {
	srv, err := rpc.NewServer(rpc.WithRoot(dir))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	svc, err := rb.Register(srv)
	if err != nil {
		return nil, err
	}
	if err := svc.Add("buf", buf); err != nil {
		return nil, err
	}
	defer svc.Remove("buf")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go srv.Serve(l)
	var out []SliceResult
	for _, mode := range []struct {
		name string
		opts []rb.DialOption
	}{
		{"by reference", []rb.DialOption{rb.WithRoot(dir)}},
		{"by reference, 8 samples a call", []rb.DialOption{rb.WithRoot(dir), rb.WithSlicesAhead(8)}},
		{"rows as bytes", []rb.DialOption{rb.WithRoot(dir), rb.WithBytes()}},
	} {
		c, err := rb.Dial(ctx, l.Addr().String(), "buf", mode.opts...)
		if err != nil {
			return nil, err
		}
		out = append(out, timeSlices(ctx, o, "tensorwire Client.SampleSlices (loopback TCP, "+mode.name+")",
			func(ctx context.Context) (*tensordict.TensorDict, rb.SliceInfo, error) {
				return c.SampleSlices(ctx, spec)
			}))
		c.Close()
	}
	// The Python client's rows: torchrl's interpreter if it has msgpack,
	// else python3's.
	py, err := newPythonEnv(o.python, dir)
	if err != nil {
		py, err = newPythonEnv("", dir)
	}
	for _, ahead := range []int{0, 8} {
		if err != nil {
			out = append(out, SliceResult{Impl: pythonImpl(ahead), Skipped: err.Error()})
			continue
		}
		out = append(out, timePythonClient(ctx, o, py, dir, l.Addr().String(), ahead))
	}
	if err == nil {
		py.remove()
	}
	return out, nil
}

// pyClientScript samples slices through the Python client by reference
// (Buffer(root=...), slices_ahead as given), checking every slice as Go
// does; it prints its figures as JSON.
const pyClientScript = `
import json, sys, time
import numpy as np
from tensorwire import replay
addr, root, L, B, D, dur, ahead = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), int(sys.argv[7])
def check(td):
    ep, st, obs = td["episode"].reshape(-1, L), td["step"].reshape(-1, L), td["obs"].reshape(-1, L, D)
    ok = (ep == ep[:, :1]).all(1) & (np.diff(st, axis=1) == 1).all(1)
    ok &= (obs == (ep * 1000 + st).astype(np.float32)[..., None]).all(-1).all(-1)
    return int((~ok).sum()), ep.shape[0]
with replay.Buffer(addr, "buf", root=root, slices_ahead=ahead) as b:
    if b.mode != "ref":
        sys.exit("the Python client did not map the buffer (sharing %s)" % b.sharing)
    check(b.sample_slices(batch_size=B, slice_len=L)[0])
    t0 = time.perf_counter(); slices = samples = bad = 0
    while time.perf_counter() - t0 < dur:
        k, n = check(b.sample_slices(batch_size=B, slice_len=L)[0])
        bad += k; slices += n; samples += 1
    el = time.perf_counter() - t0
print(json.dumps({"slices": slices, "samples": samples, "seconds": el, "slices_per_s": slices / el, "bad_slices": bad,
                  "resampled": b.resampled}))
`

// pythonImpl names the Python client's row.
func pythonImpl(ahead int) string {
	if ahead > 1 {
		return fmt.Sprintf("tensorwire Python Buffer.sample_slices (loopback TCP, by reference, slices_ahead=%d)", ahead)
	}
	return "tensorwire Python Buffer.sample_slices (loopback TCP, by reference)"
}

// timePythonClient samples slices for the duration through the Python
// client (this build's, in py), by reference, one call a sample (ahead 0)
// or one for ahead samples (slices_ahead).
func timePythonClient(ctx context.Context, o sliceOptions, py *pythonEnv, dir, addr string, ahead int) SliceResult {
	r := SliceResult{Impl: pythonImpl(ahead)}
	cmd := exec.CommandContext(ctx, py.interp, "-c", pyClientScript, addr, dir, fmt.Sprint(o.sliceLen),
		fmt.Sprint(o.batch), fmt.Sprint(o.obs), fmt.Sprint(o.duration.Seconds()), fmt.Sprint(ahead))
	cmd.Env = py.env()
	if failed, err := runPyJSON(cmd, &r); failed != "" {
		r.Skipped = failed
	} else if err != nil {
		r.Skipped = fmt.Sprintf("the Python client's output: %v", err)
	}
	return r
}

// runPyJSON runs cmd, a Python script that prints JSON on the last line
// of its output, and decodes that line into v. failed says why the script
// failed (the last line of its stderr, else the failure itself), empty
// when it ran; err, that its last line was not v's JSON.
func runPyJSON(cmd *exec.Cmd, v any) (failed string, err error) {
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if why := lastLine(ee.Stderr); why != "" {
				return why, nil
			}
		}
		return err.Error(), nil
	}
	return "", json.Unmarshal([]byte(lastLine(out)), v)
}

// lastLine returns the last line of b that is not blank, trimmed.
func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// torchrlScript loads the episodes (tensordict's memmap format, as Go wrote
// them), extends torchrl's buffer with them and samples for the duration,
// checking every slice as Go does; it prints its figures as JSON.
const torchrlScript = `
import json, sys, time, torch, torchrl
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer, LazyMemmapStorage, SliceSampler
path, scratch, L, B, D, dur, cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]), sys.argv[7] == "1"
if int(sys.argv[8]) > 0:
    torch.set_num_threads(int(sys.argv[8]))
data = TensorDict.load_memmap(path)
n = data.batch_size[0]
rb = TensorDictReplayBuffer(storage=LazyMemmapStorage(n, scratch_dir=scratch),
    sampler=SliceSampler(slice_len=L, traj_key="episode", strict_length=True, cache_values=cache), batch_size=B)
for i in range(0, n, 65536):
    rb.extend(data[i:i + 65536].clone())
def check(s):
    ep, st, obs = s["episode"].view(-1, L), s["step"].view(-1, L), s["obs"].view(-1, L, D)
    ok = (ep == ep[:, :1]).all(1) & (st[:, 1:] - st[:, :-1] == 1).all(1)
    ok &= (obs == (ep * 1000 + st).float().unsqueeze(-1)).all(-1).all(-1)
    return int((~ok).sum()), ep.shape[0]
check(rb.sample())
t0 = time.perf_counter(); slices = samples = bad = 0
while time.perf_counter() - t0 < dur:
    b, k = check(rb.sample())
    bad += b; slices += k; samples += 1
el = time.perf_counter() - t0
print(json.dumps({"impl": "torchrl %s SliceSampler%s over LazyMemmapStorage (in process, torch %s, %d threads)" % (
    torchrl.__version__, "(cache_values=True)" if cache else "", torch.__version__, torch.get_num_threads()),
    "slices": slices, "samples": samples, "seconds": el, "slices_per_s": slices / el, "bad_slices": bad}))
`

// timeTorchRL runs torchrl's SliceSampler, finding the episodes at every
// sample (its default) or once (cache_values=True, for a buffer that no
// longer changes, as here).
func timeTorchRL(ctx context.Context, o sliceOptions, data, scratch string, cache bool) SliceResult {
	c := "0"
	if cache {
		c = "1"
	}
	cmd := exec.CommandContext(ctx, o.python, "-c", torchrlScript, data, scratch, fmt.Sprint(o.sliceLen),
		fmt.Sprint(o.batch), fmt.Sprint(o.obs), fmt.Sprint(o.duration.Seconds()), c, fmt.Sprint(o.threads))
	r := SliceResult{Impl: "torchrl SliceSampler over LazyMemmapStorage"}
	if failed, err := runPyJSON(cmd, &r); failed != "" {
		r.Skipped = fmt.Sprintf("%s: %s (--python chooses an interpreter with torchrl)", o.python, failed)
	} else if err != nil {
		r.Skipped = fmt.Sprintf("torchrl's output: %v", err)
	}
	return r
}

func printSlices(w io.Writer, o sliceOptions, run SliceRun) {
	fmt.Fprintf(w, "replay slices: %d episodes of %d-%d steps (%d steps, obs %d float32), slices of %d, %d steps a sample (%d slices), %s each; every slice checked\n\n",
		run.Episodes, o.minEp, o.maxEp, run.Capacity, o.obs, o.sliceLen, o.batch, o.batch/o.sliceLen, o.duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "implementation\tslices/s\tsamples\tslices checked\tbad slices\t")
	var torchrl float64
	for _, r := range run.Results {
		if strings.HasPrefix(r.Impl, "torchrl") && r.Skipped == "" {
			torchrl = max(torchrl, r.SlicesPS) // the faster of its two
		}
	}
	for _, r := range run.Results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped: %s\t\t\t\t\n", r.Impl, r.Skipped)
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%d\t%d\t%d\t\n", r.Impl, r.SlicesPS, r.Samples, r.Slices, r.Bad)
	}
	tw.Flush()
	if torchrl > 0 {
		fmt.Fprintln(w)
		for _, r := range run.Results {
			if !strings.HasPrefix(r.Impl, "torchrl") && r.Skipped == "" {
				fmt.Fprintf(w, "%s: %.1fx torchrl's slices/s (its faster row)\n", r.Impl, r.SlicesPS/torchrl)
			}
		}
	}
}
