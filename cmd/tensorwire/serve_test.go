package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/store"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestNode_ServesAnMLP writes an MLP's parameters under the root, as
// PyTorch's state_dict memmap lays them out, serves them with "tensorwire
// node --serve", and predicts through serve.Dial by reference and by
// bytes: the outputs are the MLP's own forward pass, version 1.
func TestNode_ServesAnMLP(t *testing.T) {
	root := t.TempDir()
	sizes := []int{64, 256, 16}
	params := mlp.Random(sizes, 5)
	written, err := params.Memmap(filepath.Join(root, "policy", "params"))
	if err != nil {
		t.Fatal(err)
	}
	written.Close()
	n := startNode(t, "--root", root, "--serve", "policy,params=policy/params,replicas=2,max-batch=8")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	plain, _ := mlp.New(mlp.Config{Sizes: sizes})
	if err := plain.Load(ctx, params); err != nil {
		t.Fatal(err)
	}
	in, _ := plain.Input().Zeros(3)
	x, _ := in.Tensor(mlp.DefaultIn)
	xs, _ := tensordict.Values[float32](x)
	for i := range xs {
		xs[i] = float32(i%7) - 3
	}
	x, _ = tensordict.FromSlice(xs, 3, 64)
	in.Set(mlp.DefaultIn, x)
	want, err := plain.Forward(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]serve.DialOption{{serve.WithRoot(root)}, {serve.WithBytes()}} {
		c, err := serve.Dial(ctx, n.addr, "policy", opts...)
		if err != nil {
			t.Fatal(err)
		}
		out, v, err := c.Predict(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if v != 1 || !out.Equal(want) {
			t.Errorf("%s: version %d; outputs equal to the MLP's: %v", c.Mode(), v, out.Equal(want))
		}
		c.Close()
	}
	n.stop(t)
	if !strings.Contains(n.stderr.String(), "model served") {
		t.Errorf("stderr lacks the model's log line:\n%s", n.stderr)
	}
}

// TestNode_ServesAStoreParameter serves the MLP whose parameters are a
// parameter set of the node's own store: version 1 at start, and version
// 2 once a client publishes it.
func TestNode_ServesAStoreParameter(t *testing.T) {
	root := t.TempDir()
	sizes := []int{64, 32, 16}
	st, err := store.Open(filepath.Join(root, "params"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := st.Publish(ctx, "policy", mlp.Random(sizes, 1)); err != nil {
		t.Fatal(err)
	}
	st.Close()
	n := startNode(t, "--root", root, "--store", "params", "--serve", "policy,store=params,param=policy")
	c, err := serve.Dial(ctx, n.addr, "policy", serve.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	in, _ := c.InputSchema().Zeros(1)
	if _, v, err := c.Predict(ctx, in); err != nil || v != 1 {
		t.Fatalf("version %d, %v; want 1", v, err)
	}
	sc, err := store.Dial(ctx, n.addr, "params", store.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	v2, err := sc.Publish(ctx, "policy", mlp.Random(sizes, 2))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, v, err := c.Predict(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		if v == v2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still version %d 30 s after version %d was published", v, v2)
		}
	}
}

// TestNode_ServesAStoreParameterPublishedLater: a node told to serve a
// store's parameter set that has no version yet starts (issue 24: it used
// to refuse, so the store's own node had to be started first with a
// version in it), says so, answers NotFound for the model, and serves it
// from the first version a trainer publishes through the node.
func TestNode_ServesAStoreParameterPublishedLater(t *testing.T) {
	root := t.TempDir()
	n := startNode(t, "--root", root, "--store", "params", "--serve", "policy,store=params,param=policy")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := serve.Dial(ctx, n.addr, "policy", serve.WithRoot(root)); !errors.Is(err, rpc.ErrNotFound) {
		t.Fatalf("the model before its first version: %v, want NotFound", err)
	}
	sc, err := store.Dial(ctx, n.addr, "params", store.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, err := sc.Publish(ctx, "policy", mlp.Random([]int{8, 4}, 1)); err != nil {
		t.Fatal(err)
	}
	var c *serve.Client
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if c, err = serve.Dial(ctx, n.addr, "policy", serve.WithRoot(root)); err == nil {
			break
		}
		if !errors.Is(err, rpc.ErrNotFound) || time.Now().After(deadline) {
			t.Fatalf("the model after its first version was published: %v", err)
		}
	}
	defer c.Close()
	in, _ := c.InputSchema().Zeros(1)
	if _, v, err := c.Predict(ctx, in); err != nil || v != 1 {
		t.Fatalf("version %d, %v; want 1", v, err)
	}
}

// TestNode_ServedModelsCloseWaitsForStoreReaders: closing a node's models
// ends, and waits for, the goroutines that read a store's parameters: a
// model waiting for its first version (awaitFirst) and one following its
// store (Follow). The node closes its stores right after its models, and
// a store's Close unmaps every version it handed out, so one of them still
// loading a version could read unmapped memory and crash the node as it
// stops. It failed before close waited for them: both were left running,
// the context they had (the node's) not even ended.
func TestNode_ServedModelsCloseWaitsForStoreReaders(t *testing.T) {
	root := t.TempDir()
	st, err := store.Open(filepath.Join(root, "params"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := st.Publish(ctx, "now", mlp.Random([]int{8, 4}, 1)); err != nil {
		t.Fatal(err)
	}
	var models serveFlags
	for _, v := range []string{"a,store=params,param=now", "b,store=params,param=later"} {
		if err := models.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	readers := func() int {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		n := 0
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "(*servedModels).awaitFirst") || strings.Contains(g, "(*Manager).Follow(") {
				n++
			}
		}
		return n
	}
	before := readers()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The node's context, which has not ended: Run failed, say.
	sm, register, err := models.start(context.Background(), root, func(string) *store.Store { return st }, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := register(srv); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); readers() < before+2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines waiting on the store, want %d", readers()-before, 2)
		}
	}
	sm.close()
	if n := readers() - before; n != 0 {
		t.Fatalf("%d goroutines still read the store after the models were closed (the node closes its stores next)", n)
	}
}

// TestMLP_WritesWeightsANodeServes: "tensorwire mlp" writes a state_dict
// layout without PyTorch or tensordict (issue 24: the README's weights step
// needed tensordict), which a node serves; it refuses to overwrite
// without --force and refuses bad widths.
func TestMLP_WritesWeightsANodeServes(t *testing.T) {
	root := t.TempDir()
	var out, errb strings.Builder
	if code := run(context.Background(), []string{"mlp", "--sizes", "8,16,4", "--seed", "3", filepath.Join(root, "policy")}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if code := run(context.Background(), []string{"mlp", filepath.Join(root, "policy")}, &out, &errb); code == 0 {
		t.Error("mlp over existing weights without --force: exit 0")
	}
	if code := run(context.Background(), []string{"mlp", "--sizes", "8", filepath.Join(root, "x")}, &out, &errb); code != 2 {
		t.Errorf("mlp --sizes 8: exit %d, want 2", code)
	}
	n := startNode(t, "--root", root, "--serve", "policy,params=policy")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := serve.Dial(ctx, n.addr, "policy", serve.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if w := c.InputSchema()[0].Shape; len(w) != 1 || w[0] != 8 {
		t.Fatalf("input row shape %v, want [8]", w)
	}
	in, _ := c.InputSchema().Zeros(2)
	if _, _, err := c.Predict(ctx, in); err != nil {
		t.Fatal(err)
	}
}

func TestNode_ServeFlagErrors(t *testing.T) {
	for _, tc := range []struct{ value, want string }{
		{"", "needs a name"},
		{"m", "no params=P"},
		{"m,params=../up", "a folder under the root"},
		{"m,params=/abs", "a folder under the root"},
		{"m,params=p,replicas=-1", "replicas=-1: want at least 1"},
		{"m,replicas=0,input=obs:float32:4", "input=F and output=F go together"},
		{"m,input=obs:float32:4,output=a:int64:", "replicas=0"},
		{"m,replicas=0,input=obs:flot:4,output=a:int64:", "dtype"},
		{"m,replicas=0,store=s,param=p", "follow the store themselves"},
		{"m,params=p,max-batch=x", "max-batch=x"},
		{"m,params=p,max-delay=-1ms", "max-delay=-1ms: want a duration >= 0"},
		{"m,params=p,lease=0s", "lease=0s: want a positive duration"},
		{"m,params=p,queue=4,max-batch=8", "queue=4 is smaller than max-batch=8"},
		{"m,params=p,colour=red", `unknown setting "colour"`},
		{"m,params=p,params=q", "params given twice"},
		{"m,params", "not key=value"},
		{"m,params=p,store=s,param=x", "not both"},
		{"m,store=s", "go together"},
		{"m,param=x", "go together"},
	} {
		var f serveFlags
		if err := f.Set(tc.value); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--serve %q: %v, want an error about %q", tc.value, err, tc.want)
		}
	}
	var f serveFlags
	if err := f.Set("m,params=p"); err != nil {
		t.Fatal(err)
	}
	if err := f.Set("m,params=q"); err == nil || !strings.Contains(err.Error(), "served twice") {
		t.Errorf("a name served twice: %v", err)
	}
	// Parameters that are not there stop the node before it listens: a
	// folder, a store the node does not serve. (A parameter set not yet
	// published is waited for: TestNode_ServesAStoreParameterPublishedLater.)
	code, _, stderr := runNodeInProcess(t, "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--serve", "m,store=s,param=p")
	if code == 0 || !strings.Contains(stderr, "serves no such store") {
		t.Errorf("a store not served: exit %d, stderr:\n%s", code, stderr)
	}
	code, _, stderr = runNodeInProcess(t, "--listen", "127.0.0.1:0", "--root", t.TempDir(), "--serve", "m,params=nothing")
	if code == 0 || !strings.Contains(stderr, "model m: params") {
		t.Errorf("missing parameters: exit %d, stderr:\n%s", code, stderr)
	}
}

// TestNode_ServeSurvivesTruncatedWeights truncates the weights file of a
// model a real "tensorwire node --serve" serves, under it: the node copied
// its parameters out of the mapping when it loaded them, so predictions go
// on with the weights it loaded, and the node (and every service on it)
// lives. Before, the MLP kept views of the mapping, and the next forward
// died of SIGBUS inside gonum's sgemm.
func TestNode_ServeSurvivesTruncatedWeights(t *testing.T) {
	root := t.TempDir()
	sizes := []int{64, 256, 16}
	params := mlp.Random(sizes, 5)
	written, err := params.Memmap(filepath.Join(root, "policy"))
	if err != nil {
		t.Fatal(err)
	}
	written.Close()
	n := startNode(t, "--root", root, "--serve", "policy,params=policy,max-batch=8")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	plain, _ := mlp.New(mlp.Config{Sizes: sizes})
	if err := plain.Load(ctx, params); err != nil {
		t.Fatal(err)
	}
	in, _ := plain.Input().Zeros(2)
	x, _ := in.Tensor(mlp.DefaultIn)
	x.Fill([]int{0, 1}, 0.5)
	want, err := plain.Forward(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(root, "policy", "0.weight.memmap"), 0); err != nil {
		t.Fatal(err)
	}
	c, err := serve.Dial(ctx, n.addr, "policy", serve.WithBytes())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 {
		out, v, err := c.Predict(ctx, in)
		if err != nil {
			t.Fatalf("predict after the weights file was truncated: %v; node alive: %v; stderr:\n%s",
				err, !exited(n.proc), n.stderr)
		}
		if v != 1 || !out.Equal(want) {
			t.Fatalf("version %d; outputs equal to the loaded weights': %v", v, out.Equal(want))
		}
	}
	n.stop(t)
}

// exited reports whether p has exited.
func exited(p *nodeproc.Proc) bool {
	select {
	case <-p.Done():
		return true
	default:
		return false
	}
}
