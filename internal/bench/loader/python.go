package loader

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/python"
)

// pythonSamples is --samples with --producer python when not given: a run
// of a minute or less on two cores (the samples are made and transformed
// in a torch DataLoader, about 3 ms each here).
const pythonSamples = 1000

// runPython runs the benchmark with a Python producer (--producer python):
// python/tensorwire/_bench_loader.py, this build's Python client extracted
// into a temporary folder, run by the first of interp, python3 and
// /usr/bin/python3 that imports torch. It starts this program's node for
// the shared side (bin). Its table goes to stdout, its progress to stderr.
func runPython(ctx context.Context, o *options, interp, bin string, samplesSet bool, stdout, stderr io.Writer) error {
	py, err := benchkit.FindPython(interp, "torch, numpy, msgpack")
	if err != nil {
		return bench.Usagef("--producer python needs a python3 with torch, numpy and msgpack (--python chooses it): %v", err)
	}
	dir, err := os.MkdirTemp(o.dir, "tensorwire-bench-loader-python-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := python.Extract(dir); err != nil {
		return err
	}
	samples := o.samples
	if !samplesSet {
		samples = pythonSamples
	}
	consumers := 4
	if len(o.consumers) > 0 {
		consumers = o.consumers[len(o.consumers)-1]
	}
	args := []string{"-m", "tensorwire._bench_loader", "--bin", bin, "--samples", strconv.Itoa(samples),
		"--consumers", strconv.Itoa(consumers), "--batch", strconv.Itoa(o.batch),
		"--step", strconv.FormatFloat(o.step.Seconds(), 'f', -1, 64), "--slots", strconv.Itoa(o.slots)}
	if o.device != "" {
		args = append(args, "--device", o.device)
	}
	args = append(args, "--source", o.source, "--tensorsocket", o.tsocket)
	if o.json != "" {
		j, err := filepath.Abs(o.json)
		if err != nil {
			return err
		}
		args = append(args, "--json", j)
	}
	cmd := exec.CommandContext(ctx, py, args...)
	cmd.Env = benchkit.PythonEnv(dir)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = 10 * time.Second
	fmt.Fprintf(stderr, "loader: the Python producer's run (%s, %d samples, %d consumers)\n", py, samples, consumers)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("loader: the Python run: %w", err)
	}
	return nil
}
