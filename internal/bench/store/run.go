// Package store is "tensorwire bench store": the store of bins and
// parameters (package store) measured with every part a process of its
// own on this machine, against raw TCP moving the same bytes in the same
// run. docs/benchmarks.md says how to read it.
//
//   - broadcast: a trainer publishes parameter sets of --mb megabytes every
//     200 ms to --workers workers, which wait for the new version and read
//     every byte of it (a CRC-32C, checked against the trainer's); the
//     figure is the time from the Publish call to the last worker holding
//     the version, by reference (ref: the version is written once and
//     mapped), by bytes (bytes: it travels through the node), and by raw
//     TCP (tcp: the same bytes through a relay process that stores and
//     forwards them, no store).
//   - rollouts: 4 workers append 28 KB items flat out (8 calls in flight
//     each) while a trainer drains the bin with Get; items/s, the append
//     call's latency, and items lost or drained twice (must be 0).
//   - watch: 64 watchers (each a client of its own, 16 to a process) watch
//     a bin a putter Puts into every 20 ms; the latency from the Put call
//     to each watcher holding the event.
package store

import (
	"context"
	"flag"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench"
)

// Benchmark is "tensorwire bench store".
var Benchmark = bench.Benchmark{
	Name: name,
	Summary: "the store of bins and parameters (tensorshare's): parameter broadcast to workers by reference, by " +
		"bytes and by raw TCP; 4 workers appending rollouts while a trainer drains; watch latency to 64 watchers",
	Run: Run,
}

const name = "store"

// ErrUsage matches the errors of Run that a different command line fixes.
var ErrUsage = bench.ErrUsage

// The broadcast modes.
const (
	modeRef   = "ref"
	modeBytes = "bytes"
	modeTCP   = "tcp"
)

// options are the command line's flags.
type options struct {
	duration time.Duration
	mbs      []int
	workers  []int
	modes    []string
	parts    []string
	json     string
	root     string
	noSync   bool

	// roles (hidden)
	role     string
	addr     string
	mode     string
	param    string
	mb       int
	n        int
	period   time.Duration
	inflight int
	extend   int // items per call in the rollouts: 1 Append, more Extend
	// writersLang is the rollouts' workers' language (langGo, langPython);
	// python is the interpreter to try first for Python ones.
	writersLang string
	python      string
	out         string

	self []string
}

var hidden = []string{"role", "addr", "mode", "param", "size", "n", "period", "out"}

// Run runs the benchmark as args say; see the package doc. ctx ending
// stops it.
func Run(ctx context.Context, env bench.Env, args []string) error {
	var o options
	var mbs, workers, modes, parts string
	fs := flag.NewFlagSet("bench store", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "how long each broadcast configuration, the rollouts and the watch run")
	fs.StringVar(&mbs, "mb", "1,10,100", "parameter set sizes in MB (MiB), comma-separated")
	fs.StringVar(&workers, "workers", "1,4,8", "broadcast worker counts, comma-separated")
	fs.StringVar(&modes, "modes", "ref,bytes,tcp", "broadcast modes: ref (by reference), bytes (through the node), tcp (raw TCP relay)")
	fs.StringVar(&parts, "parts", "broadcast,rollouts,watch", "what to run")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	sync := fs.String("sync", "always", "the node's store: always (fsync before acknowledging, the default) or none (store.Options.NoSync: survives the node's process dying, not the machine)")
	fs.StringVar(&o.root, "root", "", "the folder under which the run makes its shared root (default: the system temporary directory)")
	fs.StringVar(&o.role, "role", "", "")
	fs.StringVar(&o.addr, "addr", "", "")
	fs.StringVar(&o.mode, "mode", "", "")
	fs.StringVar(&o.param, "param", "", "")
	fs.IntVar(&o.mb, "size", 0, "")
	fs.IntVar(&o.n, "n", 0, "")
	fs.DurationVar(&o.period, "period", 0, "")
	fs.IntVar(&o.inflight, "inflight", 8, "rollout calls in flight at once in each of the 4 workers")
	fs.IntVar(&o.extend, "extend", 1, "rollout items per call: 1 appends each alone (Append), more sends them together (Extend)")
	fs.StringVar(&o.writersLang, "writers-lang", langGo, "the rollouts' workers' language: go, or python (this build's Python client, tensorwire._bench_store)")
	fs.StringVar(&o.python, "python", "", "the Python interpreter for --writers-lang python (default: the first of python3 and /usr/bin/python3 with numpy and msgpack)")
	fs.StringVar(&o.out, "out", "", "")
	if err := bench.Parse(name, fs, args, env.Stdout, hidden...); err != nil {
		return err
	}
	o.self = env.Self
	switch *sync {
	case "always":
	case "none":
		o.noSync = true
	default:
		return bench.Usagef("--sync %q: want always or none", *sync)
	}
	if o.inflight < 1 {
		return bench.Usagef("--inflight %d: want 1 or more", o.inflight)
	}
	if o.writersLang != langGo && o.writersLang != langPython {
		return bench.Usagef("--writers-lang %q: want go or python", o.writersLang)
	}
	if o.extend < 1 || o.extend > 4096 {
		return bench.Usagef("--extend %d: want 1 to 4096", o.extend)
	}
	if o.role != "" {
		return runRole(ctx, &o)
	}
	var err error
	if o.mbs, err = ints("--mb", mbs); err != nil {
		return err
	}
	if o.workers, err = ints("--workers", workers); err != nil {
		return err
	}
	if o.modes, err = words("--modes", modes, modeRef, modeBytes, modeTCP); err != nil {
		return err
	}
	if o.parts, err = words("--parts", parts, "broadcast", "rollouts", "watch"); err != nil {
		return err
	}
	if o.duration <= 0 {
		return bench.Usagef("--duration %v: want a positive duration", o.duration)
	}
	return runParent(ctx, &o, env)
}

func ints(flagName, s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, bench.Usagef("%s %q: want positive numbers separated by commas", flagName, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func words(flagName, s string, allowed ...string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		ok := false
		for _, a := range allowed {
			ok = ok || a == f
		}
		if !ok {
			return nil, bench.Usagef("%s: %q is not one of %s", flagName, f, strings.Join(allowed, ", "))
		}
		out = append(out, f)
	}
	return out, nil
}

func (o *options) has(part string) bool {
	for _, p := range o.parts {
		if p == part {
			return true
		}
	}
	return false
}
