package loader

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/bench/benchkit"
	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/loader"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// loaderName is the name the node serves its producer as.
const loaderName = "bench"

// indexKey is the field of the fashion-mnist batches that holds each
// row's dataset index.
const indexKey = "index"

// augment is fashion-mnist's transform: torchvision's RandomCrop(28,
// padding=4), RandomHorizontalFlip, ToTensor and Normalize with
// Fashion-MNIST's mean and standard deviation.
func augment() loader.Transform {
	return &loader.Augment{Pad: 4, Flip: true, Mean: 0.2860, Std: 0.3530}
}

// config is the loader configuration of a child with o's flags.
func (o *options) config() loader.Config {
	cfg := loader.Config{Dataset: o.prefix, Dir: filepath.Join(o.root, "loader"), Batch: o.pbatch, Slots: o.slots,
		Window: o.slots, Seed: o.seed}
	if o.transform {
		cfg.Transform, cfg.IndexKey, cfg.Workers = augment(), indexKey, o.workers
	}
	return cfg
}

// setProcs sets this process's GOMAXPROCS to --procs, where given.
func (o *options) setProcs() {
	if o.procs > 0 {
		runtime.GOMAXPROCS(o.procs)
	}
}

// runNode is the node role: a producer of the dataset at --prefix served
// with --root as its root, until SIGTERM or the parent's end.
func runNode(o options) error {
	o.setProcs()
	ctx, stop := nodeproc.ChildContext()
	defer stop()
	p, err := loader.NewProducer(o.config())
	if err != nil {
		return err
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	err = nodeproc.Run(ctx, nodeproc.Config{
		Listen: "127.0.0.1:0", Root: o.root, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Register: func(s *rpc.Server) error {
			svc, err := loader.Register(s)
			if err != nil {
				return err
			}
			return svc.Add(loaderName, p)
		},
	}, func(addr string) { fmt.Println(nodeproc.ListeningPrefix + addr) })
	return errors.Join(err, p.Close())
}

// consumerResult is what a consumer reports, as a line of JSON on stdout
// starting with resultPrefix.
type consumerResult struct {
	Role      string `json:"role"`
	Batch     int    `json:"batch"`
	ElapsedNS int64  `json:"elapsed_ns"` // from "go" to the epoch's end
	Epochs    int    `json:"epochs"`
	Samples   int    `json:"samples"` // all epochs
	Batches   int    `json:"batches"`
	CPUNS     int64  `json:"cpu_ns"`   // user + system, over the same time
	IOBytes   int64  `json:"io_bytes"` // read and written by syscalls (sockets: mappings are not counted)
	Shared    bool   `json:"shared"`   // read the ring from its own mapping
	Procs     int    `json:"procs"`    // its GOMAXPROCS
	Problem   string `json:"problem,omitempty"`
}

var resultPrefix = []byte(`{"role":"consumer"`)

// epochs is what a consumer iterates: a loader.Consumer or loader.Local.
type epochs interface {
	Batches(ctx context.Context) iter.Seq2[*tensordict.TensorDict, error]
	Close() error
}

// runConsumer is the consumer role: it joins the node at --addr (mode
// shared) or opens the dataset itself (independent), prints "ready",
// waits for a line on stdin, iterates one epoch checking every sample and
// sleeping --step after each batch, and prints its result.
func runConsumer(o options) error {
	// Not nodeproc.ChildContext, which reads stdin to its end: the first
	// line is "go", the end of the input the parent's end.
	signal.Ignore(os.Interrupt)
	o.setProcs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	in := bufio.NewReader(os.Stdin)
	goLine := make(chan error, 1)
	go func() {
		_, err := in.ReadString('\n')
		goLine <- err
		io.Copy(io.Discard, in)
		stop()
	}()
	var it epochs
	res := consumerResult{Role: "consumer", Batch: o.batch, Procs: runtime.GOMAXPROCS(0)}
	switch o.mode {
	case shared:
		c, err := loader.Dial(ctx, o.addr, loaderName, loader.Options{Batch: o.batch, Root: o.root, Views: o.views, Bytes: o.bytes})
		if err != nil {
			return err
		}
		it, res.Shared = c, c.SharedFS()
	case independent:
		l, err := loader.NewLocal(o.config(), loader.Options{Batch: o.batch})
		if err != nil {
			return err
		}
		it = l
	default:
		return fmt.Errorf("mode %q", o.mode)
	}
	defer it.Close()
	fmt.Println("ready")
	select {
	case err := <-goLine:
		if err != nil {
			return fmt.Errorf("waiting for go: %w", err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	seen := make([]bool, o.samples)
	check := checkSynthetic
	if o.check == "index" {
		check = checkIndex
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cpu0, io0, t0 := benchkit.ProcessCPU(), ioBytes(), time.Now()
	for e := range o.epochs {
		clear(seen)
		for batch, err := range it.Batches(ctx) {
			if err != nil {
				return err
			}
			if res.Problem == "" {
				if err := check(batch, seen); err != nil {
					res.Problem = fmt.Sprintf("epoch %d, batch %d: %v", e, res.Batches, err)
				}
			}
			res.Batches++
			res.Samples += batch.Len()
			if o.step > 0 {
				time.Sleep(o.step)
			}
		}
		if res.Problem == "" {
			for i, ok := range seen {
				if !ok {
					res.Problem = fmt.Sprintf("epoch %d: sample %d never came", e, i)
					break
				}
			}
		}
	}
	res.Epochs = o.epochs
	res.ElapsedNS, res.CPUNS, res.IOBytes = int64(time.Since(t0)), int64(benchkit.ProcessCPU()-cpu0), ioBytes()-io0
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	fmt.Println(string(b))
	return nil
}

// checkSynthetic checks every sample of a synthetic batch: its index in
// its first and last 8 bytes, every other byte (7i+3) mod 256, and an
// index not seen before.
func checkSynthetic(batch *tensordict.TensorDict, seen []bool) error {
	img, err := batch.Tensor("images")
	if err != nil {
		return err
	}
	b, err := img.Bytes()
	if err != nil {
		return err
	}
	rb := img.RowBytes()
	for r := range batch.Len() {
		row := b[r*rb : (r+1)*rb]
		i := binary.LittleEndian.Uint64(row)
		if last := binary.LittleEndian.Uint64(row[rb-8:]); last != i || i >= uint64(len(seen)) {
			return fmt.Errorf("row %d: index %d at the start, %d at the end", r, i, last)
		}
		if seen[i] {
			return fmt.Errorf("sample %d twice", i)
		}
		seen[i] = true
		v := byte(7*i + 3)
		if mid := row[8 : rb-8]; bytes.Count(mid, []byte{v}) != len(mid) {
			return fmt.Errorf("sample %d: bytes other than %d", i, v)
		}
	}
	return nil
}

// checkIndex checks that no sample of a batch with an index field was
// seen before.
func checkIndex(batch *tensordict.TensorDict, seen []bool) error {
	t, err := batch.Tensor(indexKey)
	if err != nil {
		return err
	}
	idx, err := tensordict.Values[int64](t)
	if err != nil {
		return err
	}
	for _, i := range idx {
		if i < 0 || int(i) >= len(seen) || seen[i] {
			return fmt.Errorf("sample %d twice or out of range", i)
		}
		seen[i] = true
	}
	return nil
}

// ioBytes returns the bytes this process read and wrote with syscalls
// (/proc/self/io rchar + wchar: sockets, pipes and files read or written,
// not mappings), or 0 where it cannot tell.
func ioBytes() int64 { return procIO("self") }

func procIO(pid string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/io")
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "rchar" || k == "wchar") {
			x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			n += x
		}
	}
	return n
}

// procCPUNS returns the user and system CPU time of process pid, all its
// threads, from /proc/PID/stat (in clock ticks of 10 ms).
func procCPUNS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return (ut + st) * int64(tick), nil
}
