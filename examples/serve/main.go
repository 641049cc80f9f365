// Command serve runs torch_spread's scenario on package serve: a manager
// serving an MLP to 32 workers, each holding one environment state at a
// time and asking for the policy's prediction for it, one row per request.
// The manager batches their requests onto its replicas; halfway through it
// loads new weights, as a trainer publishing a better policy would make it
// do. Every worker checks every prediction against a plain forward pass of
// the weights the response says produced it.
//
//	go run ./examples/serve [--workers 32] [--steps 300] [--bytes] [--root DIR]
//
// The MLP (64 -> 256 -> 16, ReLU, float32) is serve/mlp's. Its weights are
// written under the shared root as PyTorch's
// TensorDict(model.state_dict()).memmap_(prefix) lays them out, and read
// back from there, read-only, as a node would read what PyTorch wrote.
//
// The workers dial the manager as remote clients (serve.Dial) over
// loopback TCP. Sharing the root with it, they write each state into their
// own slot of a shared mapping and the request carries only (client, row):
// the manager gathers the rows into its batch and writes the outputs
// straight back into the worker's output slot (serve.Client.PredictInto).
// With --bytes the rows travel with the requests instead.
//
// # How to read the output
//
// "mismatches: 0" is the check: every output equals, to 1e-5, the plain
// forward pass of its input with the weights of the version the response
// reported. "versions" counts the predictions each parameter version
// produced: version 1 before the update, 2 after. "mean batch" and "batch
// sizes" show the batching: 32 workers asking at once fill batches of up
// to 16 rows, where a model serving one request at a time would run 32
// forwards of one row.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/tensordict"
)

var sizes = []int{64, 256, 16}

func main() {
	workers := flag.Int("workers", 32, "worker goroutines, each a remote client")
	steps := flag.Int("steps", 300, "predictions per worker")
	bytes := flag.Bool("bytes", false, "send the rows with the requests instead of sharing slots")
	rootFlag := flag.String("root", "", "the shared root; a new folder is made under it and removed (default: the system temporary directory)")
	flag.Parse()
	if err := run(*workers, *steps, *bytes, *rootFlag); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
}

func run(workers, steps int, bytes bool, rootDir string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	root, err := os.MkdirTemp(rootDir, "tensorwire-serve-example-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return err
	}

	// Two versions of the policy's weights, written as PyTorch writes a
	// state_dict, and mapped read-only.
	var versions []*tensordict.TensorDict
	for v := range 2 {
		prefix := filepath.Join(root, fmt.Sprintf("policy-v%d", v+1))
		written, err := mlp.Random(sizes, uint64(v+1)).Memmap(prefix)
		if err != nil {
			return err
		}
		written.Close()
		params, err := tensordict.LoadMemmap(prefix, tensordict.ReadOnly())
		if err != nil {
			return err
		}
		defer params.Close()
		versions = append(versions, params)
	}

	// The manager: two replicas of the MLP, batches of up to 16 rows.
	shape, err := mlp.New(mlp.Config{Sizes: sizes})
	if err != nil {
		return err
	}
	m, err := serve.New(serve.Config{
		Input: shape.Input(), Output: shape.Output(), MaxBatch: 16, Replicas: 2,
		New: func(int) (serve.Model, error) { return mlp.New(mlp.Config{Sizes: sizes}) },
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := m.Load(ctx, versions[0]); err != nil { // version 1
		return err
	}

	// Served on loopback, as "tensorwire node --serve" serves it.
	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		return err
	}
	svc, err := serve.Register(srv)
	if err != nil {
		srv.Close()
		return err
	}
	defer func() {
		srv.Close()
		svc.Close() // the bells' pollers, after the server
	}()
	if err := svc.Add("policy", m); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go srv.Serve(l)

	var (
		mu         sync.Mutex
		mismatches int
		byVersion  = map[uint64]int{}
		firstErr   error
		halfway    sync.WaitGroup
		wg         sync.WaitGroup
	)
	halfway.Add(workers)
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			res, err := worker(ctx, l.Addr().String(), root, bytes, w, steps, versions, &halfway)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("worker %d: %w", w, err)
			}
			mismatches += res.mismatches
			for v, n := range res.byVersion {
				byVersion[v] += n
			}
		})
	}
	// Halfway through, new weights: every replica switches between two
	// batches, and every response after Load returns says version 2.
	halfway.Wait()
	v, err := m.Load(ctx, versions[1])
	if err != nil {
		return err
	}
	fmt.Printf("loaded version %d while the workers ran\n", v)
	wg.Wait()
	took := time.Since(start)
	if firstErr != nil {
		return firstErr
	}

	st := m.Stats()
	mode := "shared slots (by reference)"
	if bytes {
		mode = "bytes"
	}
	fmt.Printf("%d workers x %d predictions of one row, %s: %v (%.0f predictions/s)\n",
		workers, steps, mode, took.Round(time.Millisecond), float64(workers*steps)/took.Seconds())
	fmt.Printf("versions: 1: %d, 2: %d\n", byVersion[1], byVersion[2])
	fmt.Printf("forwards: %d, mean batch %.2f, batch sizes %s\n", st.Batches, st.MeanBatch(), sizesOf(st.Sizes))
	fmt.Printf("mismatches: %d\n", mismatches)
	if mismatches > 0 {
		return fmt.Errorf("%d predictions differ from the plain forward pass", mismatches)
	}
	return nil
}

type workerResult struct {
	mismatches int
	byVersion  map[uint64]int
}

// worker dials the policy, and for each step writes a random state into
// its input slot, predicts it in place and checks the output against its
// own plain MLP loaded with the version the response names. It marks
// halfway done after half its steps.
func worker(ctx context.Context, addr, root string, bytes bool, w, steps int, versions []*tensordict.TensorDict,
	halfway *sync.WaitGroup) (res workerResult, err error) {
	res.byVersion = map[uint64]int{}
	half := false
	defer func() {
		if !half {
			halfway.Done()
		}
	}()
	opts := []serve.DialOption{serve.WithRoot(root)}
	if bytes {
		opts = append(opts, serve.WithBytes())
	}
	c, err := serve.Dial(ctx, addr, "policy", opts...)
	if err != nil {
		return res, err
	}
	defer c.Close()

	// The plain forward pass: one MLP per version, in this goroutine.
	plain := map[uint64]*mlp.MLP{}
	for i, p := range versions {
		pm, err := mlp.New(mlp.Config{Sizes: sizes})
		if err != nil {
			return res, err
		}
		if err := pm.Load(ctx, p); err != nil {
			return res, err
		}
		plain[uint64(i+1)] = pm
	}

	rng := rand.New(rand.NewPCG(uint64(w), 7))
	obs := make([]float32, sizes[0])
	for step := range steps {
		if step == steps/2 {
			half = true
			halfway.Done()
		}
		for i := range obs {
			obs[i] = float32(rng.NormFloat64())
		}
		x, _ := tensordict.FromSlice(obs, 1, sizes[0])
		state, _ := tensordict.New(1)
		state.Set(mlp.DefaultIn, x)
		if err := c.Input().SetSlice(0, state); err != nil { // this worker's slot 0
			return res, err
		}
		v, err := c.PredictInto(ctx, 0, 1)
		if err != nil {
			return res, err
		}
		res.byVersion[v]++
		got, err := c.Output().Slice(0, 1)
		if err != nil {
			return res, err
		}
		pm, ok := plain[v]
		if !ok {
			return res, fmt.Errorf("a response of version %d, which was never loaded", v)
		}
		want, err := pm.Forward(ctx, state)
		if err != nil {
			return res, err
		}
		if !close(got, want) {
			res.mismatches++
		}
	}
	return res, nil
}

// close reports whether the logits of a and b agree to 1e-5.
func close(a, b *tensordict.TensorDict) bool {
	ta, err1 := a.Tensor(mlp.DefaultOut)
	tb, err2 := b.Tensor(mlp.DefaultOut)
	if err1 != nil || err2 != nil {
		return false
	}
	va, err1 := tensordict.Values[float32](ta)
	vb, err2 := tensordict.Values[float32](tb)
	if err1 != nil || err2 != nil || len(va) != len(vb) {
		return false
	}
	for i := range va {
		if math.Abs(float64(va[i])-float64(vb[i])) > 1e-5 {
			return false
		}
	}
	return true
}

// sizesOf formats a histogram of batch sizes, the most frequent first.
func sizesOf(sizes []uint64) string {
	type kv struct {
		n int
		c uint64
	}
	var all []kv
	var total uint64
	for n, c := range sizes {
		if c > 0 {
			all = append(all, kv{n, c})
			total += c
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].c > all[j].c })
	s := ""
	for i, e := range all {
		if i == 6 {
			s += " ..."
			break
		}
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d:%.0f%%", e.n, 100*float64(e.c)/float64(total))
	}
	return s
}
