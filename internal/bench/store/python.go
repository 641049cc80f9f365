package store

import (
	"context"
	"os"
	"strconv"

	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/python"
)

// The rollouts' workers in Python (--writers-lang python): the module
// python/tensorwire/_bench_store.py of this build's Python client,
// extracted into the run's folder, run by the first of --python, python3
// and /usr/bin/python3 that imports numpy and msgpack. It speaks a Go
// role's protocol: "ready" on stdout, a stop at its stdin's end, the
// appender's JSON in --out.
const (
	langGo     = "go"
	langPython = "python"
)

// pythonRoles is where the Python workers come from: the interpreter and
// the folder holding the extracted client.
type pythonRoles struct {
	interp string
	path   string
}

// newPythonRoles finds an interpreter and extracts the client under dir.
func newPythonRoles(interp, dir string) (*pythonRoles, error) {
	py, err := benchkit.FindPython(interp, "numpy, msgpack")
	if err != nil {
		return nil, bench.Usagef("--writers-lang python needs a python3 with numpy and msgpack (--python chooses it): %v", err)
	}
	path, err := os.MkdirTemp(dir, "python-")
	if err != nil {
		return nil, err
	}
	if err := python.Extract(path); err != nil {
		return nil, err
	}
	return &pythonRoles{interp: py, path: path}, nil
}

// appender starts the Python appender n.
func (p *pythonRoles) appender(ctx context.Context, o *options, env bench.Env, outs, root, addr string, n int) (*proc, error) {
	argv := []string{p.interp, "-m", "tensorwire._bench_store", "--role", "appender", "--addr", addr, "--root", root,
		"--n", strconv.Itoa(n), "--inflight", strconv.Itoa(o.inflight), "--extend", strconv.Itoa(o.extend)}
	return startArgv(ctx, env, outs, "python appender "+strconv.Itoa(n), argv, benchkit.PythonEnv(p.path))
}
