// Package collective is the collectives benchmark, "tensorwire bench
// collective": allreduce, allgather, reduce-scatter, reduce, broadcast,
// gather, scatter and alltoall of float32 tensors at 1 KiB to 64 MiB, with 2 and 4 ranks as
// processes, through shared mappings ("shm") and over loopback TCP
// ("tcp"), against memcpy bandwidth measured in the same run.
//
//	tensorwire bench collective [--ops allreduce,allgather,reduce-scatter,reduce,broadcast,gather,scatter,alltoall,allreduce-fwd-bwd,allreduce-fwd-bwd-alloc]
//	    [--ranks 2,4] [--sizes 1KB,64KB,1MB,16MB,64MB] [--transports shm,tcp] [--hosts local|netns [--layout HxR]] [--gloo auto|off] [--json FILE]
//
// For each transport and rank count the benchmark starts that many copies
// of the running program, each a rank ("--role rank"), which form a
// communicator (collective.Join) on a free loopback port. With --hosts
// netns (root only; TCP only) each rank runs instead on a host of its own,
// a Linux network namespace on a bridge (internal/testkit/netns), so the ranks
// talk TCP between separate addresses through veth pairs and the bridge
// rather than over loopback; rank 0 listens on its host's address. With
// --layout HxR (netns only) the ranks are R on each of H hosts instead, and
// --transports takes hier (the default there is tcp,hier): "tcp" runs every
// rank over TCP, those of one host too, "hier" a hierarchical communicator
// (shared mappings within a host, its leader over TCP between hosts; each
// host's ranks share a folder of the host's under /dev/shm). For each
// operation and size, in that order, the ranks run a few untimed
// iterations and then timed ones (from 500 at 1 KiB down to 5 at 64 MiB):
// each iteration is a Barrier and then the operation, and rank 0 times the
// operation alone. Tensors are allocated once per size (the Into calls, in
// place where the call allows) and filled with random floats before
// timing, so every page is touched (warm figures) and the bytes do not
// compress.
//
// What "bytes" means follows NCCL's tests: the size of the whole tensor
// each rank holds for allreduce, reduce (to rank 0, into an output of its
// own) and broadcast; the size of the gathered result for allgather and
// gather (to rank 0; each rank contributes bytes/n); of each rank's input
// for reduce-scatter (each gets bytes/n) and alltoall, and of the root's
// for scatter (from rank 0; each gets bytes/n). The algorithm bandwidth is bytes over the
// p50 time; the bus bandwidth is NCCL's correction of it to what each
// link carries: allreduce algbw * 2(n-1)/n; allgather, reduce-scatter and
// gather, scatter and alltoall algbw * (n-1)/n; reduce and broadcast
// algbw.
// sendrecv (not in the default --ops) is a point-to-point ping-pong
// between ranks 2i and 2i+1 (a rank left over idles): the even rank Sends
// bytes and Recvs them back, the odd rank the other way round; the p50 is
// the round trip, and its busbw is 2·bytes over it, the bytes one way per
// half round trip. The transport shm-inline (local only) is shm with
// collective.Config.ShmSendMin -1: every point-to-point message inline over
// rpc, as before messages went by reference, for a side-by-side figure;
// --p2p-ref-min sets ShmSendMin for the other transports. The transport
// shm-alloc (local only) is shm with every tensor from Comm.Alloc, a
// shared buffer the other ranks map: Allreduce (and forward+backward's
// two), Reduce and ReduceScatter run in place, and the other operations
// read the inputs where they are instead of copying them through the data
// files (docs/collective.md, "Shared buffers"); sendrecv's messages go by a
// reference to the buffer, not through the sender's p2p arena.
// allreduce-fwd-bwd is an allreduce on a collective.Tape and its backward
// pass (a second allreduce, of the gradient seed), timed together, with
// allreduce's formula over the two: mpi4torch's "forward+backward" figure.
// It keeps its buffers from step to step as a training loop does
// (Tape.AllreduceInto into an output it holds, Tape.BackwardInPlace of a
// seed it holds, reduced in place and not refilled, as allreduce's tensor
// is); allreduce-fwd-bwd-alloc is the same with the tape's defaults, a new
// output and a new seed of ones each step, to show what allocating costs.
//
// The table's memcpy line is copy() of 64 MiB between two touched Go
// buffers in the parent process, best of 5: the bandwidth of one core
// moving bytes in memory, which every shm figure should be read against.
//
// With shm in the run, it measures B, the aggregate memory bandwidth of p
// processes each copying 64 MiB of its own at once (bytes read plus
// written), for every rank count p, before the ranks run; the shm
// allreduce lines get the bound 2B/p on their busbw (each rank reads each
// input byte of its share once and the result is read in place, issue 29)
// and the fraction of it reached. With --gloo auto (the default) and a
// Python with torch at hand, gloo's allreduce and forward+backward run
// beside, from Python at the same rank counts and sizes (the --lang python
// path), and each line of those operations gets gloo's p50 over its own;
// with --mpi auto (the default) and mpicc and mpirun on PATH, Open MPI's
// MPI_Allreduce (a C program the run builds, openmpi/allreduce.c) the
// same way, each allreduce line getting Open MPI's p50 over its own.
package collective

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/collective"
	"github.com/tensorwire/tensorwire/internal/bench"
	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/bench/report"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Benchmark is "tensorwire bench collective".
var Benchmark = bench.Benchmark{
	Name:    "collective",
	Summary: "allreduce, allgather, reduce-scatter, reduce, broadcast, gather, scatter and alltoall between ranks as processes, by shared mapping and over TCP, against memcpy",
	Run:     Run,
}

// ErrUsage matches the errors a different command line fixes.
var ErrUsage = bench.ErrUsage

var allOps = []string{"allreduce", "allgather", "reduce-scatter", "reduce", "broadcast", "gather", "scatter", "alltoall", "allreduce-fwd-bwd", "allreduce-fwd-bwd-alloc"}

// moreOps are the operations --ops takes beyond the default ones.
var moreOps = []string{"sendrecv"}

type options struct {
	ops        []string
	ranks      []int
	sizes      []int
	transports []string
	hosts      string
	layout     [2]int // --layout: hosts and ranks per host; zero: a host per rank
	json       string
	gloo       string
	mpi        string // --mpi: auto or off

	role      string
	rank      int
	size      int
	addr      string
	transport string
	shmDir    string
	p2pRefMin int
}

// Run runs the benchmark.
func Run(ctx context.Context, env bench.Env, args []string) error {
	var o options
	var ops, ranks, sizes, transports string
	fs := flag.NewFlagSet("bench collective", flag.ContinueOnError)
	fs.StringVar(&ops, "ops", strings.Join(allOps, ","), "operations to run: "+strings.Join(append(slices.Clone(allOps), moreOps...), ", "))
	fs.StringVar(&ranks, "ranks", "2,4", "rank counts to run with")
	fs.StringVar(&sizes, "sizes", "1KB,64KB,1MB,16MB,64MB", "tensor sizes (KB, MB: 1024 and 1024*1024 bytes)")
	fs.StringVar(&transports, "transports", "shm,tcp", "transports: shm (shared mappings), tcp (loopback), shm-inline (shm with every point-to-point message inline over rpc), shm-alloc (shm with every tensor from Comm.Alloc: shared buffers, read in place)")
	fs.IntVar(&o.p2pRefMin, "p2p-ref-min", 0, "collective.Config.ShmSendMin: the smallest point-to-point message sent by reference through the shared folder (0: the default, 4 KiB; -1: none)")
	fs.StringVar(&o.hosts, "hosts", "local", "where the ranks run: local (this host, loopback), netns (a network namespace each, joined by a bridge; root, tcp only)")
	layout := fs.String("layout", "", "--hosts netns: HxR, R ranks on each of H hosts (--ranks is then H*R; --transports tcp,hier)")
	fs.StringVar(&o.json, "json", "", "also write the figures as JSON to this file")
	fs.StringVar(&o.mpi, "mpi", "auto", "auto: run Open MPI's MPI_Allreduce beside (allreduce; built with mpicc, started with mpirun) when both are on PATH; off: not")
	fs.StringVar(&o.gloo, "gloo", "auto", "auto: run torch.distributed's gloo allreduce beside (allreduce and allreduce-fwd-bwd, over loopback TCP) when a Python with torch is at hand (--python); off: not")
	lang := fs.String("lang", "go", "go: Go ranks; python: allreduce (and sendrecv: Send and Recv) from Python (tensorwire.collective, gloo, mpi4torch) beside Go's, with the Python overhead per call (defaults then: --ops allreduce,allreduce-fwd-bwd --ranks 4 --sizes 1KB,16MB,64MB)")
	var po pyOptions
	fs.StringVar(&po.python, "python", "", "--lang python: the Python interpreter (with numpy, msgpack and torch; default python3)")
	systems := fs.String("systems", strings.Join(allSystems, ","), "--lang python: what to run from Python: "+strings.Join(allSystems, ", "))
	fs.StringVar(&po.sidecar, "tensorwire", "", "--lang python: the tensorwire binary for the sidecars (default this program, or PATH's)")
	fs.StringVar(&o.role, "role", "", "internal: run as a rank")
	fs.IntVar(&o.rank, "rank", 0, "internal: this rank")
	fs.IntVar(&o.size, "size", 0, "internal: the number of ranks")
	fs.StringVar(&o.addr, "addr", "", "internal: rank 0's address")
	fs.StringVar(&o.transport, "transport", "", "internal: the transport")
	fs.StringVar(&o.shmDir, "shm-dir", "", "internal: the rank's shared folder")
	if err := bench.Parse("collective", fs, args, env.Stdout, "role", "rank", "size", "addr", "transport", "shm-dir"); err != nil {
		return err
	}
	if o.role == "membw" {
		return runMemBW(os.Stdin, env.Stdout)
	}
	if o.mpi != "auto" && o.mpi != "off" {
		return bench.Usagef("--mpi %q: want auto or off", o.mpi)
	}
	if o.gloo != "auto" && o.gloo != "off" {
		return bench.Usagef("--gloo %q: want auto or off", o.gloo)
	}
	var err error
	if *lang == "python" && o.role == "" {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["ops"] {
			ops = "allreduce,allreduce-fwd-bwd"
		}
		if !set["ranks"] {
			ranks = "4"
		}
		if !set["sizes"] {
			sizes = "1KB,16MB,64MB"
		}
		if po.systems, err = parseList(*systems, allSystems); err != nil {
			return err
		}
	} else if *lang != "go" {
		return bench.Usagef("--lang %q: want go or python", *lang)
	}
	if o.ops, err = parseList(ops, append(slices.Clone(allOps), moreOps...)); err != nil {
		return err
	}
	if o.transports, err = parseList(transports, []string{"shm", "tcp", "hier", "shm-inline", "shm-alloc"}); err != nil {
		return err
	}
	if *layout != "" {
		if o.layout, err = parseLayout(*layout); err != nil {
			return err
		}
		if o.hosts != "netns" {
			return bench.Usagef("--layout places ranks on network-namespace hosts: give --hosts netns")
		}
	}
	switch o.hosts {
	case "local":
		if slices.Contains(o.transports, "hier") {
			return bench.Usagef("--transports hier needs ranks on several hosts: --hosts netns --layout HxR")
		}
	case "netns":
		set := false
		fs.Visit(func(f *flag.Flag) { set = set || f.Name == "transports" })
		if !set {
			o.transports = []string{"tcp"}
			if o.layout[0] > 0 {
				o.transports = []string{"tcp", "hier"}
			}
		}
		if slices.ContainsFunc(o.transports, isShm) {
			return bench.Usagef("--hosts netns runs the ranks on separate hosts: --transports tcp or hier only")
		}
		if slices.Contains(o.transports, "hier") && o.layout[0] == 0 {
			return bench.Usagef("--transports hier: give --layout HxR (R ranks on each of H hosts)")
		}
	default:
		return bench.Usagef("--hosts %q: want local or netns", o.hosts)
	}
	for _, r := range strings.Split(ranks, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n < 1 {
			return bench.Usagef("--ranks: %q is not a rank count", r)
		}
		o.ranks = append(o.ranks, n)
	}
	if o.layout[0] > 0 && o.role == "" {
		o.ranks = []int{o.layout[0] * o.layout[1]}
	}
	for _, s := range strings.Split(sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		o.sizes = append(o.sizes, n)
	}
	if o.role == "rank" {
		return runRank(ctx, o, env.Stdout)
	}
	if *lang == "python" {
		if o.hosts != "local" {
			return bench.Usagef("--lang python runs on this host only")
		}
		for _, op := range o.ops {
			if op != "allreduce" && op != "allreduce-fwd-bwd" && op != "sendrecv" {
				return bench.Usagef("--lang python: --ops allreduce, allreduce-fwd-bwd and sendrecv only")
			}
		}
		return runPython(ctx, o, po, env)
	}
	return runParent(ctx, o, po, env)
}

func parseList(s string, allowed []string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(s, ",") {
		v = strings.TrimSpace(v)
		if !slices.Contains(allowed, v) {
			return nil, bench.Usagef("%q is not one of %s", v, strings.Join(allowed, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}

// parseLayout parses --layout HxR.
func parseLayout(s string) ([2]int, error) {
	h, r, ok := strings.Cut(strings.ToLower(strings.TrimSpace(s)), "x")
	hn, err1 := strconv.Atoi(h)
	rn, err2 := strconv.Atoi(r)
	if !ok || err1 != nil || err2 != nil || hn < 1 || rn < 1 {
		return [2]int{}, bench.Usagef("--layout %q: want HxR, R ranks on each of H hosts (2x2)", s)
	}
	return [2]int{hn, rn}, nil
}

func parseSize(s string) (int, error) {
	s = strings.ToUpper(strings.TrimSpace(s))
	mult := 1
	switch {
	case strings.HasSuffix(s, "KB"):
		mult, s = 1<<10, strings.TrimSuffix(s, "KB")
	case strings.HasSuffix(s, "MB"):
		mult, s = 1<<20, strings.TrimSuffix(s, "MB")
	case strings.HasSuffix(s, "B"):
		s = strings.TrimSuffix(s, "B")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, bench.Usagef("--sizes: %q is not a size", s)
	}
	return n * mult, nil
}

// Line is one measured point: an operation, a rank count, a size and a
// transport (the JSON keys of issue 17). P50us is the median time of the
// operation on rank 0 in microseconds; AlgBW is Bytes over it and BusBW
// NCCL's bus bandwidth, both in GB/s (1e9 bytes a second). Hosts is
// "netns" when the ranks ran on network-namespace hosts (--hosts netns),
// and absent when they ran on this one; Layout is --layout (HxR) when
// given.
type Line struct {
	Op        string  `json:"op"`
	Ranks     int     `json:"ranks"`
	Bytes     int     `json:"bytes"`
	Transport string  `json:"transport"`
	Hosts     string  `json:"hosts,omitempty"`
	Layout    string  `json:"layout,omitempty"`
	System    string  `json:"system,omitempty"` // --lang python: go, tensorwire, gloo or mpi4torch
	P50us     float64 `json:"p50_us"`
	AlgBW     float64 `json:"algbw_GBps"`
	BusBW     float64 `json:"busbw_GBps"`
	// Bound is, for an Allreduce, the bound on its busbw measured in the
	// same run (lineBound; halved for forward+backward's two): through
	// shared mappings 2B/p for p ranks, with B the aggregate memory
	// bandwidth of p processes (Result.MemBW); over TCP on this host
	// min(p, k)/(p·c), for k cores and c the CPU time of a byte through
	// loopback TCP (Result.Loopback, Result.Cores). OfBound is BusBW over
	// it.
	Bound   float64 `json:"bound_GBps,omitempty"`
	OfBound float64 `json:"busbw_of_bound,omitempty"`
	// VsGloo is gloo's p50 over this line's for the same operation, rank
	// count and size, measured in the same run: above 1, faster than gloo.
	VsGloo float64 `json:"gloo_p50_over_p50,omitempty"`
	// VsMPI is Open MPI's p50 over this line's, the same way (--mpi).
	VsMPI float64 `json:"openmpi_p50_over_p50,omitempty"`
}

// Result is what --json writes: every measured line (gloo's with System
// "gloo"), the memcpy bandwidth of the same run (GB/s: 1e9 bytes a
// second), the machine's wake-up round trip (benchkit.Wake, measured
// before any rank starts; absent where it cannot be), what a byte costs
// through loopback TCP and the cores the ranks share (the TCP lines'
// bound; the cost absent where it cannot be measured), the aggregate
// memory bandwidth of p processes for each rank count p run through
// shared mappings, and notes (why gloo did not run).
type Result struct {
	Runs       []Line             `json:"runs"`
	MemcpyGBps float64            `json:"memcpy_GBps"`
	Wake       *benchkit.Wake     `json:"wake_round_trip,omitempty"`
	Loopback   *benchkit.Loopback `json:"loopback,omitempty"`
	Cores      int                `json:"cores,omitempty"`
	MemBW      []MemBW            `json:"membw,omitempty"`
	Notes      []string           `json:"notes,omitempty"`
}

// lockedWriter serializes the writes of the ranks' stderr copiers.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func runParent(ctx context.Context, o options, po pyOptions, env bench.Env) error {
	env.Stderr = &lockedWriter{w: env.Stderr}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var hosts []rankHost
	if o.hosts == "netns" {
		nh := slices.Max(o.ranks)
		if o.layout[0] > 0 {
			nh = o.layout[0]
		}
		hs, closeHosts, err := netnsHosts(nh)
		if err != nil {
			return err
		}
		defer closeHosts()
		hosts = hs
	}
	res := Result{MemcpyGBps: memcpyGBps()}
	fmt.Fprintf(env.Stderr, "memcpy: %.2f GB/s\n", res.MemcpyGBps)
	var wakeLine string
	res.Wake, wakeLine = benchkit.WakeReference()
	fmt.Fprintln(env.Stderr, wakeLine)
	res.Cores = runtime.NumCPU()
	loopLine := loopbackLine(ctx, &res)
	fmt.Fprintln(env.Stderr, loopLine)
	if slices.ContainsFunc(o.transports, isShm) {
		if res.MemBW, err = runMemBWs(ctx, env, exe, o.ranks); err != nil {
			return err
		}
	}
	for _, tr := range o.transports {
		for _, n := range o.ranks {
			runs, err := runGroup(ctx, o, env, exe, tr, n, hosts)
			if err != nil {
				return fmt.Errorf("%s, %d ranks: %w", tr, n, err)
			}
			res.Runs = append(res.Runs, runs...)
		}
	}
	gloo, note, err := runGloo(ctx, o, po, env, exe)
	if err != nil {
		return err
	}
	if note != "" {
		res.Notes = append(res.Notes, note)
	}
	mpi, note, err := runOpenMPI(ctx, o, env)
	if err != nil {
		return err
	}
	if note != "" {
		res.Notes = append(res.Notes, note)
	}
	figures(&res, gloo, mpi)
	res.Runs = append(res.Runs, gloo...)
	res.Runs = append(res.Runs, mpi...)
	t := report.NewTable("op", "ranks", "transport", "bytes", "p50 us", "algbw GB/s", "busbw GB/s", "busbw / memcpy", "bound GB/s", "busbw / bound", "gloo p50 / p50", "openmpi p50 / p50")
	opt := func(v float64, f string) string {
		if v == 0 {
			return ""
		}
		return fmt.Sprintf(f, v)
	}
	for _, r := range res.Runs {
		tr := r.Transport
		if r.Hosts != "" {
			tr += "/" + r.Hosts
		}
		if r.Layout != "" {
			tr += " " + r.Layout
		}
		if r.System == "gloo" || r.System == "openmpi" {
			tr = r.System
		}
		t.Row(r.Op, r.Ranks, tr, r.Bytes, fmt.Sprintf("%.1f", r.P50us), fmt.Sprintf("%.3f", r.AlgBW), fmt.Sprintf("%.3f", r.BusBW), fmt.Sprintf("%.3f", r.BusBW/res.MemcpyGBps),
			opt(r.Bound, "%.3f"), opt(r.OfBound, "%.3f"), opt(r.VsGloo, "%.2f"), opt(r.VsMPI, "%.2f"))
	}
	t.WriteTo(env.Stdout)
	fmt.Fprintf(env.Stdout, "\nmemcpy (one core, 64 MiB, warm): %.2f GB/s\n", res.MemcpyGBps)
	fmt.Fprintln(env.Stdout, wakeLine)
	fmt.Fprintln(env.Stdout, loopLine)
	for _, b := range res.MemBW {
		fmt.Fprintf(env.Stdout, "memory bandwidth B, %d processes each copying 64 MiB of its own at once (read plus written): %.2f GB/s\n", b.Procs, b.GBps)
	}
	for _, n := range res.Notes {
		fmt.Fprintln(env.Stdout, n)
	}
	if o.json != "" {
		return report.WriteJSON(o.json, res)
	}
	return nil
}

// memcpyGBps returns the best of 5 copies of 64 MiB between touched
// buffers.
func memcpyGBps() float64 {
	a, b := make([]byte, 64<<20), make([]byte, 64<<20)
	for i := range a {
		a[i] = byte(i)
	}
	copy(b, a)
	best := time.Duration(1 << 62)
	for range 5 {
		start := time.Now()
		copy(b, a)
		best = min(best, time.Since(start))
	}
	return report.GBps(int64(len(a)), best)
}

// runGroup starts n ranks on transport tr, on this host or on hosts[:n]
// when hosts is not nil, and collects rank 0's lines.
func runGroup(ctx context.Context, o options, env bench.Env, exe, tr string, n int, hosts []rankHost) ([]Line, error) {
	var addr string
	if hosts != nil {
		// A fresh namespace: the port is free, and each group gets its own.
		addr = fmt.Sprintf("%s:%d", hosts[0].Addr(), 29500+n)
	} else {
		var err error
		if addr, err = loopbackAddr(); err != nil {
			return nil, err
		}
	}
	sizes := sizeArgs(o.sizes)
	hostOf := func(r int) int { return r }
	var layout string
	var shmBase string
	if o.layout[0] > 0 {
		hostOf = func(r int) int { return r / o.layout[1] }
		layout = fmt.Sprintf("%dx%d", o.layout[0], o.layout[1])
		// Each host's ranks share a folder, every host one of its own:
		// the hosts share this machine's kernel, and a host is a kernel
		// and a folder (collective.Topology).
		var err error
		if shmBase, err = os.MkdirTemp(shmRoot(), "tensorwire-bench-collective-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(shmBase)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cmds []*exec.Cmd
	var out io.Reader
	var err error
	for r := range n {
		args := append(slices.Clone(env.Self), "--role", "rank", "--rank", strconv.Itoa(r), "--size", strconv.Itoa(n),
			"--addr", addr, "--transport", tr, "--ops", strings.Join(o.ops, ","), "--sizes", strings.Join(sizes, ","),
			"--p2p-ref-min", strconv.Itoa(o.p2pRefMin))
		if shmBase != "" {
			dir := fmt.Sprintf("%s/h%d", shmBase, hostOf(r))
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, err
			}
			args = append(args, "--shm-dir", dir)
		}
		cmd := exec.CommandContext(ctx, exe, args...)
		if hosts != nil {
			// ip netns exec enters the namespace and execs the program.
			cmd = exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", hosts[hostOf(r)].Namespace(), exe}, args...)...)
		}
		cmd.Stderr = env.Stderr
		if r == 0 {
			if out, err = cmd.StdoutPipe(); err != nil {
				return nil, err
			}
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds = append(cmds, cmd)
	}
	var runs []Line
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var r Line
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue
		}
		if hosts != nil {
			r.Hosts = "netns"
		}
		r.Layout = layout
		fmt.Fprintf(env.Stderr, "%s %d ranks %s %d B: p50 %.1f us, busbw %.3f GB/s\n", r.Transport, r.Ranks, r.Op, r.Bytes, r.P50us, r.BusBW)
		runs = append(runs, r)
	}
	var first error
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil && first == nil {
			first = fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return runs, first
}

// iterations returns how many timed iterations a size gets.
func iterations(bytes int) int { return max(5, min(500, (256<<20)/bytes)) }

// runRank is one rank: it runs every operation at every size and, on rank
// 0, prints a JSON line for each.
func runRank(ctx context.Context, o options, stdout io.Writer) error {
	jctx, cancel := context.WithTimeout(ctx, time.Minute)
	tr, refMin := o.transport, o.p2pRefMin
	switch tr {
	case "shm-inline":
		tr, refMin = "shm", -1
	case "shm-alloc":
		tr = "shm"
	}
	c, err := collective.Join(jctx, collective.Config{Rank: o.rank, Size: o.size, Addr: o.addr, Transport: collective.Transport(tr), ShmDir: o.shmDir, ShmSendMin: refMin})
	cancel()
	if err != nil {
		return err
	}
	defer c.Close()
	if string(c.Transport()) != tr {
		return fmt.Errorf("transport %s, asked for %s", c.Transport(), tr)
	}
	n := c.Size()
	enc := json.NewEncoder(stdout)
	for _, op := range o.ops {
		for _, bytes := range o.sizes {
			elems := max(bytes/4/n*n, n) // a multiple of n
			var held *[]*tensordict.Tensor
			if o.transport == "shm-alloc" {
				held = new([]*tensordict.Tensor)
			}
			run, err := prepare(c, op, elems, held)
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			iters := iterations(bytes)
			for range min(iters, 20) / 4 {
				if err := run(ctx); err != nil {
					return fmt.Errorf("%s %d B: %w", op, bytes, err)
				}
			}
			times := make([]time.Duration, 0, iters)
			for range iters {
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				start := time.Now()
				if err := run(ctx); err != nil {
					return fmt.Errorf("%s %d B: %w", op, bytes, err)
				}
				times = append(times, time.Since(start))
			}
			if held != nil {
				// Every rank is done with them: the last call returned
				// once all had read and written them.
				for _, t := range *held {
					c.Free(t)
				}
			}
			if c.Rank() != 0 {
				continue
			}
			sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
			p50 := report.Percentile(times, 50)
			b := elems * 4
			alg := report.GBps(int64(b), p50)
			bus := alg * busFactor(op, n)
			if err := enc.Encode(Line{Op: op, Ranks: n, Bytes: b, Transport: o.transport, P50us: float64(p50) / 1e3, AlgBW: alg, BusBW: bus}); err != nil {
				return err
			}
		}
	}
	return c.Barrier(ctx)
}

// busFactor is NCCL's bus bandwidth correction.
func busFactor(op string, n int) float64 {
	switch op {
	case "allreduce", "allreduce-fwd-bwd", "allreduce-fwd-bwd-alloc":
		return 2 * float64(n-1) / float64(n)
	case "broadcast", "reduce":
		return 1
	case "sendrecv":
		return 2 // the round trip's bytes one way per half of it
	}
	return float64(n-1) / float64(n)
}

// touched returns a tensor of elems random float32 in [0, 1) (scaled by
// v), every page written: data that no compression on the wire shrinks.
func touched(elems int, v float32) (*tensordict.Tensor, error) {
	x := make([]float32, elems)
	s := uint64(elems)*0x9e3779b97f4a7c15 | 1
	for i := range x {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		x[i] = v * float32(s>>40) / (1 << 24)
	}
	return tensordict.FromSlice(x)
}

// isShm reports whether the transport tr is one of shared mappings.
func isShm(tr string) bool { return strings.HasPrefix(tr, "shm") }

// prepare allocates the tensors of op at elems elements (the whole
// tensor, as "bytes" counts it) and returns one iteration. With held not
// nil every tensor is from c.Alloc, and added to *held (for Free).
func prepare(c *collective.Comm, op string, elems int, held *[]*tensordict.Tensor) (func(context.Context) error, error) {
	n := c.Size()
	touched := func(elems int, v float32) (*tensordict.Tensor, error) {
		t, err := touched(elems, v)
		if err != nil || held == nil {
			return t, err
		}
		s, err := c.Alloc(memmap.Float32, elems)
		if err != nil {
			return nil, err
		}
		*held = append(*held, s)
		copy(must(s.Bytes()), must(t.Bytes()))
		return s, nil
	}
	// in and out: an input of ones (scaled) and an output of zeros, at
	// the sizes op's row gives; out 0 gives none.
	inOut := func(in, out int) (x, y *tensordict.Tensor, err error) {
		if x, err = touched(in, 1); err != nil || out == 0 {
			return x, nil, err
		}
		y, err = touched(out, 0)
		return x, y, err
	}
	var x, y *tensordict.Tensor
	var err error
	switch op {
	case "allreduce", "broadcast", "allreduce-fwd-bwd-alloc":
		x, y, err = inOut(elems, 0)
	case "allreduce-fwd-bwd", "reduce", "alltoall":
		x, y, err = inOut(elems, elems)
	case "allgather", "gather":
		x, y, err = inOut(elems/n, elems)
	case "reduce-scatter", "scatter":
		x, y, err = inOut(elems, elems/n)
	case "sendrecv":
		if x, err = touched(elems, 1); err != nil {
			return nil, err
		}
		return sendRecv(c, x), nil
	default:
		return nil, errors.New("unknown op " + op)
	}
	if err != nil {
		return nil, err
	}
	switch op {
	case "allreduce":
		return func(ctx context.Context) error { return c.AllreduceInto(ctx, x, x, collective.Sum) }, nil
	case "allreduce-fwd-bwd":
		// A training loop's buffers, kept from step to step: the
		// forward's output y and the backward's seed (reduced in place,
		// as allreduce's tensor is, not refilled), so no step allocates.
		seed, err := touched(elems, 1)
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			tp := collective.NewTape(c)
			yv, err := tp.AllreduceInto(ctx, y, tp.Leaf(x), collective.Sum)
			if err != nil {
				return err
			}
			return tp.BackwardInPlace(ctx, yv, seed)
		}, nil
	case "allreduce-fwd-bwd-alloc":
		// The same with the tape's defaults: each step a new output and
		// a new seed of ones (the backward reduces it in place).
		return func(ctx context.Context) error {
			tp := collective.NewTape(c)
			y, err := tp.Allreduce(ctx, tp.Leaf(x), collective.Sum)
			if err != nil {
				return err
			}
			return tp.Backward(ctx, y, nil)
		}, nil
	case "broadcast":
		return func(ctx context.Context) error { return c.BcastInto(ctx, x, 0) }, nil
	case "allgather":
		return func(ctx context.Context) error { return c.AllgatherInto(ctx, y, x, 0) }, nil
	case "gather":
		return func(ctx context.Context) error { return c.GatherInto(ctx, y, x, 0, 0) }, nil
	case "reduce-scatter":
		return func(ctx context.Context) error { return c.ReduceScatterInto(ctx, y, x, collective.Sum, 0, nil) }, nil
	case "scatter":
		return func(ctx context.Context) error { return c.ScatterInto(ctx, y, x, 0, nil, 0) }, nil
	case "reduce":
		return func(ctx context.Context) error { return c.ReduceInto(ctx, y, x, collective.Sum, 0) }, nil
	default: // alltoall: n pieces of each rank's input along axis 0, gathered along axis 1
		xa, err := tensordict.FromBytes(memmap.Float32, []int{n, elems / n}, must(x.Bytes()))
		if err != nil {
			return nil, err
		}
		ya, err := tensordict.FromBytes(memmap.Float32, []int{1, elems}, must(y.Bytes()))
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error { return c.AlltoallInto(ctx, ya, xa, 1, 0, nil) }, nil
	}
}

// sendRecv is the sendrecv op's iteration: a ping-pong of x between ranks
// 2i and 2i+1 (a rank left over idles).
func sendRecv(c *collective.Comm, x *tensordict.Tensor) func(context.Context) error {
	me := c.Rank()
	peer := me ^ 1
	if peer >= c.Size() {
		return func(context.Context) error { return nil }
	}
	return func(ctx context.Context) error {
		if me%2 == 0 {
			if err := c.Send(ctx, x, peer, 0); err != nil {
				return err
			}
			return c.Recv(ctx, x, peer, 0)
		}
		if err := c.Recv(ctx, x, peer, 0); err != nil {
			return err
		}
		return c.Send(ctx, x, peer, 0)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// rankHost is where --hosts netns runs a rank: a network-namespace host
// (internal/testkit/netns, Unix only).
type rankHost interface {
	Addr() netip.Addr
	Namespace() string
}

// loopbackAddr returns a loopback address with a port free a moment ago:
// rank 0's rendezvous.
func loopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// sizeArgs returns the sizes as the ranks' --sizes flag takes them (bytes,
// "B" suffixed).
func sizeArgs(sizes []int) []string {
	out := make([]string, len(sizes))
	for i, s := range sizes {
		out[i] = strconv.Itoa(s) + "B"
	}
	return out
}

// shmRoot is where --layout makes the hosts' shared folders: /dev/shm, or
// the temporary folder where there is none.
func shmRoot() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}
