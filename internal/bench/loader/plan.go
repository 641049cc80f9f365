package loader

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
)

// startTimeout bounds how long a consumer may take to be ready, and
// runTimeout how long it may take to iterate its epoch.
const (
	startTimeout = 2 * time.Minute
	runTimeout   = 30 * time.Minute
)

// runPlan runs p over the dataset at prefix (n samples): the producer node
// for mode shared, then the consumers; once all are ready it tells them to
// go, and collects their results and the CPU time the node spent meanwhile.
func runPlan(ctx context.Context, o *options, p plan, prefix string, n int, root string, stderr io.Writer) (Figures, error) {
	run := Figures{Dataset: p.dataset, Consumers: len(p.batches), Mode: p.mode, BatchSizes: p.batches, Samples: n}
	epochs := o.epochs
	if p.dataset == fashion {
		epochs = o.fepochs
	}
	common := []string{"--prefix", prefix, "--root", root, "--samples", strconv.Itoa(n), "--seed", strconv.FormatUint(o.seed, 10), "--epochs", strconv.Itoa(epochs),
		"--slots", strconv.Itoa(o.slots), "--views=" + strconv.FormatBool(o.views), "--bytes=" + strconv.FormatBool(o.bytes), "--workers", strconv.Itoa(o.workers), "--procs", strconv.Itoa(o.procs)}
	if p.dataset == fashion {
		common = append(common, "--transform", "--check", "index", "--producer-batch", strconv.Itoa(o.fpbatch), "--step", o.fstep.String())
	} else {
		common = append(common, "--check", "synthetic", "--producer-batch", strconv.Itoa(o.pbatch), "--step", o.step.String())
	}
	var node *nodeproc.Proc
	if p.mode == shared {
		var err error
		args := slices.Concat(o.self, []string{"--role", "node"}, common)
		if o.profile != "" {
			args = append(args, "--cpuprofile", fmt.Sprintf("%s-%s-node.pprof", o.profile, filepath.Base(root)))
		}
		node, err = nodeproc.Spawn(ctx, nodeproc.Child{Name: "producer node", Args: args, Stderr: stderr})
		if err != nil {
			return run, err
		}
		defer node.Stop()
	}
	var cs []*child
	defer func() {
		for _, c := range cs {
			c.kill()
		}
	}()
	for i, b := range p.batches {
		args := slices.Concat(o.self, []string{"--role", "consumer", "--mode", p.mode, "--batch", strconv.Itoa(b)}, common)
		if node != nil {
			args = append(args, "--addr", node.Addr)
		}
		if o.profile != "" {
			args = append(args, "--cpuprofile", fmt.Sprintf("%s-%s-%s-consumer%d.pprof", o.profile, filepath.Base(root), p.mode, i))
		}
		c, err := startChild(fmt.Sprintf("consumer %d", i), args, stderr)
		if err != nil {
			return run, err
		}
		cs = append(cs, c)
	}
	for _, c := range cs {
		if line, err := c.line(ctx, startTimeout); err != nil || line != "ready" {
			return run, fmt.Errorf("%s: %q, %v (want ready)", c.name, line, err)
		}
	}
	var cpu0 int64
	if node != nil {
		var err error
		if cpu0, err = procCPUNS(node.Pid()); err != nil {
			return run, err
		}
	}
	for _, c := range cs {
		if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
			return run, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	var results []consumerResult
	for _, c := range cs {
		line, err := c.line(ctx, runTimeout)
		if err != nil {
			return run, fmt.Errorf("%s: %w", c.name, err)
		}
		var r consumerResult
		if !bytes.HasPrefix([]byte(line), resultPrefix) || json.Unmarshal([]byte(line), &r) != nil {
			return run, fmt.Errorf("%s printed %q, not its result", c.name, line)
		}
		if o.procs > 0 && r.Procs != o.procs {
			return run, fmt.Errorf("%s ran at GOMAXPROCS %d, not --procs %d", c.name, r.Procs, o.procs)
		}
		results = append(results, r)
	}
	if node != nil {
		cpu1, err := procCPUNS(node.Pid())
		if err != nil {
			return run, err
		}
		run.ProducerCPUS = float64(cpu1-cpu0) / 1e9
		if err := node.Stop(); err != nil {
			return run, err
		}
	}
	for _, c := range cs {
		if err := c.wait(); err != nil {
			return run, err
		}
	}
	run.summarize(results, o.bytes)
	return run, nil
}

// summarize fills run's figures in from the consumers' results; bytes
// says the shared consumers were to get their batches as bytes (--bytes).
func (run *Figures) summarize(rs []consumerResult, bytes bool) {
	run.ExactlyOnce = true
	run.CPUS = run.ProducerCPUS
	var rate, batches, io float64
	epochs := 1.0
	run.MinSamplesPerS = -1
	for i, r := range rs {
		perS := float64(r.Samples) / (float64(r.ElapsedNS) / 1e9)
		epochs = float64(r.Epochs)
		rate += perS
		if run.MinSamplesPerS < 0 || perS < run.MinSamplesPerS {
			run.MinSamplesPerS = perS
		}
		run.CPUS += float64(r.CPUNS) / 1e9
		run.ConsumerCPUS = append(run.ConsumerCPUS, float64(r.CPUNS)/1e9)
		batches += float64(r.Batches)
		io += float64(r.IOBytes)
		run.ElapsedS = max(run.ElapsedS, float64(r.ElapsedNS)/1e9)
		if r.Problem != "" || r.Samples != run.Samples*r.Epochs {
			run.ExactlyOnce = false
			if run.Problem == "" {
				run.Problem = fmt.Sprintf("consumer %d (batch %d): %d samples; %s", i, r.Batch, r.Samples, r.Problem)
			}
		}
		switch {
		case run.Mode == shared && !bytes && !r.Shared:
			run.Problem += fmt.Sprintf(" consumer %d got bytes, not the ring;", i)
		case run.Mode == shared && bytes && r.Shared:
			run.Problem += fmt.Sprintf(" consumer %d mapped the ring, not bytes;", i)
		}
	}
	run.SamplesPerSPerConsumer = rate / float64(len(rs))
	// Per epoch.
	run.CPUS /= epochs
	run.ProducerCPUS /= epochs
	for i := range run.ConsumerCPUS {
		run.ConsumerCPUS[i] /= epochs
	}
	run.ElapsedS /= epochs
	if batches > 0 {
		run.NetBytesPerBatch = io / batches
	}
}

// child is a consumer process: its stdout line by line, its stdin.
type child struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // closed at the end of its stdout
}

func startChild(name string, args []string, stderr io.Writer) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c := &child{name: name, cmd: cmd, lines: make(chan string, 4)}
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

// line returns the child's next line of output, waiting up to d.
func (c *child) line(ctx context.Context, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("exited: %v", c.cmd.Wait())
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("nothing within %v", d)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// wait waits for the child to exit after its result.
func (c *child) wait() error {
	c.stdin.Close()
	for range c.lines {
	}
	if err := c.cmd.Wait(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s (pid %d): %w", c.name, c.cmd.Process.Pid, err)
	}
	c.cmd = nil
	return nil
}

// kill ends a child that has not been waited for.
func (c *child) kill() {
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGKILL)
	c.stdin.Close()
	for range c.lines {
	}
	c.cmd.Wait()
}
