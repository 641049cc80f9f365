// Command params runs tensorshare's reinforcement-learning example on the
// store: a trainer publishes a network's parameters, four workers read the
// latest version, generate rollouts with it and add them tagged with the
// version, and the trainer aggregates batches of on-policy rollouts (those
// made with its latest version; tensorshare's filter_version), trains on
// them and publishes the next version. It prints what it checked.
//
//	go run ./examples/params [--iters 10] [--batch 16] [--root DIR] [--addr HOST:PORT --store NAME]
//
// Without --addr the node is in this process: a store under a new
// temporary root (or under --root), served on a loopback port, as
// "tensorwire node --root DIR --store params" would serve it. With --addr
// the example uses a node you started, sharing --root:
//
//	tensorwire node --listen 127.0.0.1:7070 --root DIR --store params
//	go run ./examples/params --addr 127.0.0.1:7070 --root DIR
//
// Every worker and the trainer dial the node on connections of their own,
// as separate machines would. Sharing the root, parameters travel by
// reference: the trainer writes each version once into a prefix the node
// renames into place, and each worker maps it read-only (no worker
// downloads it); rollouts are small and travel as bytes.
//
// # What it checks
//
//   - every rollout the trainer trained on was made with its latest
//     version, and the off-policy ones were dropped, not trained on;
//   - every parameter version a worker read is exactly what the trainer
//     published as that version (a checksum per version), mapped from the
//     shared root;
//   - versions a worker read only ever increase;
//   - at the end, every rollout a worker added was either trained on,
//     dropped as off-policy, or is still in the bin: none lost, none twice.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

const (
	workers = 4
	inputs  = 10 // torch.nn.Linear(10, 2), as in tensorshare's README
	outputs = 2
)

func main() {
	iters := flag.Int("iters", 10, "training iterations (versions published after the first)")
	batch := flag.Int("batch", 16, "on-policy rollouts per training batch")
	root := flag.String("root", "", "the shared root (default: a new temporary folder, removed at the end)")
	addr := flag.String("addr", "", "a node serving the store, sharing --root (default: one in this process)")
	name := flag.String("store", "params", "the store's name on the node")
	flag.Parse()
	if err := run(*iters, *batch, *root, *addr, *name); err != nil {
		log.Fatal(err)
	}
}

func run(iters, batch int, root, addr, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if root == "" {
		dir, err := os.MkdirTemp("", "tensorwire-params-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		root = dir
	}
	if addr == "" {
		a, stop, err := serve(root, name)
		if err != nil {
			return err
		}
		defer stop()
		addr = a
		fmt.Printf("node: the store %q under %s, serving on %s\n", name, root, addr)
	}
	dial := func() (*store.Client, error) { return store.Dial(ctx, addr, name, store.WithRoot(root)) }

	tc, err := dial()
	if err != nil {
		return err
	}
	defer tc.Close()
	fmt.Println("shared filesystem:", tc.SharedFS())
	trainer, err := store.NewTrainer(tc) // "parameters", "data", filter_version: tensorshare's defaults
	if err != nil {
		return err
	}
	// Start from an empty bin: a node you started may hold old rollouts.
	if _, err := tc.Delete(ctx, "data"); err != nil {
		return err
	}

	var (
		mu        sync.Mutex
		published = map[uint64]uint32{} // version -> checksum of its weights
		problems  []string
		added     atomic.Int64
	)
	problem := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	model := newNet()
	publish := func() (uint64, error) {
		td, sum := model.params()
		v, err := trainer.Publish(ctx, td)
		if err == nil {
			mu.Lock()
			published[v] = sum
			mu.Unlock()
		}
		return v, err
	}
	if _, err := publish(); err != nil {
		return err
	}

	// The workers: tensorshare's RLWorker loop.
	wctx, stopWorkers := context.WithCancel(ctx)
	defer stopWorkers()
	var wg sync.WaitGroup
	var reads, mapped atomic.Int64
	errs := make(chan error, workers)
	for id := range workers {
		c, err := dial()
		if err != nil {
			return err
		}
		defer c.Close()
		w, err := store.NewWorker(c)
		if err != nil {
			return err
		}
		wg.Go(func() {
			if err := runWorker(wctx, id, w, &mu, published, problem, &reads, &mapped, &added); err != nil && wctx.Err() == nil {
				errs <- fmt.Errorf("worker %d: %w", id, err)
			}
		})
	}

	// The trainer: aggregate a batch of on-policy rollouts, train, publish.
	trained, dropped := 0, 0
	for it := range iters {
		var xs [][]float32
		for len(xs) < batch {
			select {
			case err := <-errs:
				stopWorkers()
				return err
			default:
			}
			rs, err := trainer.Rollouts(ctx)
			if err != nil {
				stopWorkers()
				return err
			}
			for _, r := range rs {
				if r.Version != trainer.Version() {
					problem("trained on a rollout of version %d while the latest is %d", r.Version, trainer.Version())
				}
				x, err := rolloutInput(r.TD)
				r.Close()
				if err != nil {
					stopWorkers()
					return err
				}
				if len(xs) < batch {
					xs = append(xs, x)
				} else {
					dropped++ // more than the batch: tensorshare's trainer drops them too
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		loss := model.train(xs)
		trained += len(xs)
		v, err := publish()
		if err != nil {
			stopWorkers()
			return err
		}
		fmt.Printf("iteration %d: loss %.4f on %d rollouts of version %d; published version %d\n", it, loss, len(xs), v-1, v)
	}
	stopWorkers()
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}

	// Account for every rollout: trained on, dropped (off-policy, or past a
	// batch), or still in the bin.
	rs, err := trainer.Rollouts(ctx)
	if err != nil {
		return err
	}
	left := len(rs)
	for _, r := range rs {
		r.Close()
	}
	offPolicy := trainer.Dropped()
	total := int64(trained + dropped + offPolicy + left)
	fmt.Printf("rollouts: %d added by %d workers; %d trained on, %d dropped as off-policy, %d past a full batch, %d left at the end\n",
		added.Load(), workers, trained, offPolicy, dropped, left)
	if total != added.Load() {
		problem("%d rollouts added but %d accounted for", added.Load(), total)
	}
	fmt.Printf("checked: every rollout trained on was made with the latest version (filter_version)\n")
	fmt.Printf("checked: %d parameter reads by workers, each the exact version published (checksum), %d of them mapped from the shared root\n",
		reads.Load(), mapped.Load())
	if tc.SharedFS() && mapped.Load() != reads.Load() {
		problem("by reference, %d of %d reads were not mappings", reads.Load()-mapped.Load(), reads.Load())
	}
	fmt.Printf("checked: no rollout lost or counted twice\n")
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Println("PROBLEM:", p)
		}
		return errors.New("the checks failed")
	}
	fmt.Println("all checks passed")
	return nil
}

// runWorker is tensorshare's RLWorker example: wait for parameters, then
// generate rollouts and add them, loading the newest parameters between
// rollouts.
func runWorker(ctx context.Context, id int, w *store.Worker, mu *sync.Mutex, published map[uint64]uint32,
	problem func(string, ...any), reads, mappedReads, added *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(uint64(id), 1))
	var last uint64
	check := func(p *store.Param) error {
		defer p.Close()
		sum, err := checksum(p.TD)
		if err != nil {
			return err
		}
		// The trainer records a version's checksum once Publish returns,
		// which may be just after this worker read it.
		var want uint32
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			v, ok := published[p.Version]
			mu.Unlock()
			if ok {
				want = v
				break
			}
			if time.Now().After(deadline) {
				problem("worker %d: read version %d, which the trainer never published", id, p.Version)
				break
			}
		}
		if sum != want {
			problem("worker %d: version %d differs from what was published", id, p.Version)
		}
		if wt, err := p.TD.Tensor("weight"); err == nil && wt.Mapped() {
			mappedReads.Add(1)
		}
		if p.Version < last {
			problem("worker %d: read version %d after %d", id, p.Version, last)
		}
		last = p.Version
		reads.Add(1)
		return nil
	}
	p, err := w.WaitNewer(ctx) // the first version
	if err != nil {
		return err
	}
	if err := check(p); err != nil {
		return err
	}
	for ctx.Err() == nil {
		x := make([]float32, inputs)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		t, _ := tensordict.FromSlice(x, 1, inputs)
		td, _ := tensordict.New()
		td.Set("x", t)
		// Not ctx: an append cut short by the stop may still have been
		// applied, and then it would be in the bin but not counted.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		err := w.AddRollout(actx, td)
		cancel()
		if err != nil {
			return err
		}
		added.Add(1)
		time.Sleep(2 * time.Millisecond) // tensorshare's workers sleep .2 s; a short pause keeps this quick
		p, err := w.Params(ctx)
		if err != nil {
			return err
		}
		if err := check(p); err != nil {
			return err
		}
	}
	return nil
}

// rolloutInput returns a rollout's x.
func rolloutInput(td *tensordict.TensorDict) ([]float32, error) {
	x, err := td.Tensor("x")
	if err != nil {
		return nil, err
	}
	return tensordict.Values[float32](x)
}

// linear is torch.nn.Linear(10, 2): weight [2, 10], bias [2].
type linear struct {
	w [outputs * inputs]float32
	b [outputs]float32
}

func newNet() *linear {
	var n linear
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range n.w {
		n.w[i] = float32(rng.NormFloat64()) * 0.3
	}
	return &n
}

// params returns the state dict as a TensorDict, and a checksum of it.
func (n *linear) params() (*tensordict.TensorDict, uint32) {
	w, _ := tensordict.FromSlice(append([]float32(nil), n.w[:]...), outputs, inputs)
	b, _ := tensordict.FromSlice(append([]float32(nil), n.b[:]...), outputs)
	td, _ := tensordict.New()
	td.Set("weight", w)
	td.Set("bias", b)
	sum, _ := checksum(td)
	return td, sum
}

func checksum(td *tensordict.TensorDict) (uint32, error) {
	var sum uint32
	for _, key := range []string{"weight", "bias"} {
		t, err := td.Tensor(key)
		if err != nil {
			return 0, err
		}
		b := make([]byte, t.NumBytes())
		if _, err := t.ReadAt(b, 0); err != nil {
			return 0, err
		}
		sum = crc32.Update(sum, crc32.IEEETable, b)
	}
	return sum, nil
}

// train takes one step of gradient descent on the mean output, as the
// README's trainer does (loss = net(x).mean(); w -= 0.001 * grad).
func (n *linear) train(xs [][]float32) float64 {
	var loss float64
	for _, x := range xs {
		for o := range outputs {
			y := n.b[o]
			for i := range inputs {
				y += n.w[o*inputs+i] * x[i]
			}
			loss += float64(y)
		}
	}
	scale := float32(1) / float32(len(xs)*outputs)
	for o := range outputs {
		for i := range inputs {
			var g float32
			for _, x := range xs {
				g += x[i]
			}
			n.w[o*inputs+i] -= 0.001 * g * scale
		}
		n.b[o] -= 0.001 * float32(len(xs)) * scale
	}
	return loss / float64(len(xs)*outputs)
}

// serve runs a node in this process: the store root/name, served on a
// loopback port as "tensorwire node --root ROOT --store NAME" does.
func serve(root, name string) (string, func(), error) {
	s, err := store.Open(filepath.Join(root, name), store.Options{})
	if err != nil {
		return "", nil, err
	}
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		s.Close()
		return "", nil, err
	}
	svc, err := store.Register(srv)
	if err == nil {
		err = svc.Add(name, s)
	}
	l, lerr := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		err = lerr
	}
	if err != nil {
		srv.Close()
		s.Close()
		return "", nil, err
	}
	go srv.Serve(l)
	return l.Addr().String(), func() {
		srv.Close()
		s.Close()
	}, nil
}
