package collective

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// openmpiSource is Open MPI's side of the allreduce lines: a C program
// the run builds with mpicc.
//
//go:embed openmpi/allreduce.c
var openmpiSource []byte

// runOpenMPI runs Open MPI's MPI_Allreduce beside (issue 29 measures the
// shared mappings against it), when --mpi is auto, the run has allreduce,
// and mpicc and mpirun are on PATH: built into a temporary folder, started
// by mpirun with every rank count of the run on this host. A note says
// why it did not run, when it did not.
func runOpenMPI(ctx context.Context, o options, env bench.Env) ([]Line, string, error) {
	if o.mpi == "off" || !slices.Contains(o.ops, "allreduce") {
		return nil, "", nil
	}
	if o.hosts != "local" {
		return nil, "openmpi: not run (--hosts " + o.hosts + ")", nil
	}
	mpicc, err1 := exec.LookPath("mpicc")
	mpirun, err2 := exec.LookPath("mpirun")
	if err1 != nil || err2 != nil {
		return nil, "openmpi: not run: mpicc and mpirun are not both on PATH (Debian: openmpi-bin, libopenmpi-dev)", nil
	}
	dir, err := os.MkdirTemp("", "tensorwire-bench-openmpi-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(dir)
	src, bin := filepath.Join(dir, "allreduce.c"), filepath.Join(dir, "allreduce")
	if err := os.WriteFile(src, openmpiSource, 0o600); err != nil {
		return nil, "", err
	}
	if out, err := exec.CommandContext(ctx, mpicc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		return nil, fmt.Sprintf("openmpi: not run: mpicc: %v: %s", err, out), nil
	}
	var lines []Line
	for _, n := range o.ranks {
		var args []string
		for _, s := range o.sizes {
			args = append(args, strconv.Itoa(s))
		}
		cmd, out, err := startMPI(ctx, mpirun, n, os.Environ(), "", env, bin, args...)
		if err != nil {
			return nil, "", err
		}
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r Line
			if json.Unmarshal(sc.Bytes(), &r) == nil && r.System == "openmpi" {
				fmt.Fprintf(env.Stderr, "openmpi %d ranks allreduce %d B: p50 %.1f us, busbw %.3f GB/s\n", r.Ranks, r.Bytes, r.P50us, r.BusBW)
				lines = append(lines, r)
			}
		}
		if err := cmd.Wait(); err != nil {
			return lines, fmt.Sprintf("openmpi: %d ranks: mpirun: %v", n, err), nil
		}
	}
	return lines, "", nil
}

// startMPI starts prog with args as n ranks under mpirun (with env, in dir
// when not empty; stderr to the run's), and returns it with its stdout.
func startMPI(ctx context.Context, mpirun string, n int, env []string, dir string, benv bench.Env, prog string, args ...string) (*exec.Cmd, io.Reader, error) {
	cmd := exec.CommandContext(ctx, mpirun, append([]string{"-n", strconv.Itoa(n), "--oversubscribe", "--bind-to", "none", prog}, args...)...)
	// Open MPI refuses root without these (CI and containers run as root).
	cmd.Env = append(env, "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
	cmd.Dir = dir
	cmd.Stderr = benv.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, out, nil
}
