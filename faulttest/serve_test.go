package faulttest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/nodeproc"
	"github.com/tensorwire/tensorwire/internal/testkit/netns"
	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/serve"
	"github.com/tensorwire/tensorwire/serve/mlp"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Serving across hosts (docs/serve.md, docs/reliability.md): a node serving
// the MLP ("tensorwire node --serve policy,params=policy,...") and client
// processes on hosts of their own predicting continuously, each computing
// every answer again with its own copy of the model (serve/mlp, the same
// parameters) and counting what it got wrong: "ref" (by reference, by
// bell, two workers), "into" (by reference, PredictInto on its own rows),
// "bytes" (no root), "cut" (bytes) and "victim" (by reference, four calls
// always in flight). Every call has a deadline of svDeadline.
//
// The victim is killed with SIGKILL: the node serves the others on, and
// drops its registration and removes its folder once its lease has run
// out. The cut client's host is cut off: its calls fail by their
// deadlines, the others go on, and once reconnected it predicts again.
// The node is killed with SIGKILL and started again on the same address
// and root: the clients carry on by themselves (they retry, and register
// again), each call either answered right or failed by its deadline.
// Throughout no answer is wrong and no call outlives its deadline by more
// than svHangSlack; the errors clients saw are counted by kind, and every
// kind must be one docs/serve.md names for the fault.
//
// TestServeForwardFails runs a node (a helper process serving the same
// MLP, wrapped) whose Forward panics, fails or hangs on rows that ask for
// it, with two replicas.

func init() {
	roles["serve-client"] = runServeClient
	roles["serve-node"] = runServeNode
}

const (
	svName      = "policy"
	svSeed      = 7 // of the parameters, mlp.Random
	svMaxBatch  = 8
	svDeadline  = 2 * time.Second  // each call's
	svHangSlack = 10 * time.Second // a call returning later than its deadline and this has hung
	svLease     = 2 * time.Second
	svGap       = 100 * time.Millisecond // a client reports pauses between answers longer than this
	svChunks    = 8                      // PredictInto: the row ranges each worker uses in turn
)

// svSizes are the MLP's layer widths.
var svSizes = []int{16, 32, 4}

// The codes a row's first input holds to make the faulty node's Forward
// misbehave on the batch it is in.
const (
	svPanic = -1000 // Forward panics
	svError = -2000 // Forward returns an error
	svHang  = -3000 // Forward waits for the file "gate" under the root
)

// writeServeParams writes the model's parameters where the node reads
// them: ROOT/policy, as PyTorch's state_dict memmap.
func writeServeParams(t *testing.T, root string) {
	t.Helper()
	td, err := mlp.Random(svSizes, svSeed).Memmap(filepath.Join(root, svName))
	if err != nil {
		t.Fatal(err)
	}
	td.Close()
}

// svModel returns the model the node serves, computed here.
func svModel() (*mlp.MLP, error) {
	m, err := mlp.New(mlp.Config{Sizes: svSizes})
	if err != nil {
		return nil, err
	}
	return m, m.Load(context.Background(), mlp.Random(svSizes, svSeed))
}

// svKind names an error's kind, as the scenario counts them.
func svKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, serve.ErrForward):
		return "forward"
	case errors.Is(err, serve.ErrQueueFull):
		return "queue_full"
	case errors.Is(err, rpc.ErrUnavailable):
		return "unavailable"
	}
	return "other"
}

// runServeClient dials the model and predicts until its context ends,
// with -workers goroutines, checking every answer. It prints "ready MODE",
// by reference "dir D" (its folder), then "ok N" every 20 answers (N: all
// so far), "err KIND ms=T at=A poison=P: MESSAGE" for each call that
// failed (T: how long it took; A: when, Unix ms), "gap FROM TO" (Unix ms) for each pause between a
// worker's answers longer than svGap, "wrong ..." for each wrong answer,
// "hang ms=T" for each call that outlived its deadline by svHangSlack,
// and at the end "final ok=N".
func runServeClient(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve-client", flag.ContinueOnError)
	addr := fs.String("addr", "", "the node")
	root := fs.String("root", "", "the shared root; empty: bytes")
	tokenFile := fs.String("token-file", "", "the shared secret")
	into := fs.Bool("into", false, "PredictInto on the worker's own rows, not Predict")
	workers := fs.Int("workers", 1, "calls in flight")
	poison := fs.Int("poison", 0, "every Nth call of worker 0 holds a row that makes Forward panic or fail (0: none)")
	hang := fs.Bool("hang", false, "worker 0's first call holds a row that makes Forward wait for ROOT/gate")
	if err := fs.Parse(args); err != nil {
		return err
	}
	token, err := nodeproc.ReadToken(*tokenFile)
	if err != nil {
		return err
	}
	slots := *workers * svMaxBatch
	if *into {
		slots *= svChunks
	}
	if *hang {
		// A call that its context ended keeps its slots by bell until the
		// node answers it (docs/serve.md): the hung one's, until the gate
		// opens. The others need slots of their own.
		slots += svMaxBatch
	}
	opts := []serve.DialOption{serve.WithRPC(rpc.WithToken(token)), serve.WithSlots(slots)}
	if *root != "" {
		opts = append(opts, serve.WithRoot(*root))
	}
	var c *serve.Client
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 500*time.Millisecond) {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err = serve.Dial(dctx, *addr, svName, opts...)
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, rpc.ErrUnavailable) {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	defer c.Close()
	fmt.Println("ready", c.Mode())
	if c.Mode() == "ref" {
		dir, err := svOwnFolder(*root)
		if err != nil {
			return err
		}
		fmt.Println("dir", dir)
	}
	var (
		oks  atomic.Int64
		outM sync.Mutex // one line at a time
		wg   sync.WaitGroup
	)
	say := func(format string, args ...any) {
		outM.Lock()
		fmt.Printf(format+"\n", args...)
		outM.Unlock()
	}
	for w := range *workers {
		wg.Go(func() {
			model, err := svModel()
			if err != nil {
				say("err other ms=0 poison=none: %v", err)
				return
			}
			rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(w)))
			retired := make([]bool, svChunks) // PredictInto rows the node may still write
			last := time.Now()
			for i := 0; ctx.Err() == nil; i++ {
				n := 1 + rng.IntN(svMaxBatch)
				in := svInput(rng, n)
				code := 0
				switch {
				case w == 0 && *hang && i == 0:
					code = svHang
				case w == 0 && *poison > 0 && i%*poison == *poison-1:
					code = []int{svPanic, svError}[(i / *poison)%2]
				}
				if code != 0 {
					in.Fill([]int{0}, float64(code))
				}
				chunk := -1
				if *into {
					for k := range svChunks {
						if !retired[(i+k)%svChunks] {
							chunk = (i + k) % svChunks
							break
						}
					}
					if chunk < 0 {
						say("err other ms=0 poison=none: every row range was retired after a failed PredictInto")
						return
					}
				}
				began := time.Now()
				cctx, cancel := context.WithTimeout(ctx, svDeadline)
				out, err := svPredict(cctx, c, in, n, w*svChunks*svMaxBatch+max(chunk, 0)*svMaxBatch, *into)
				cancel()
				took := time.Since(began)
				if ctx.Err() != nil {
					return // stopping: the call's end is ours
				}
				if took > svDeadline+svHangSlack {
					say("hang ms=%d", took.Milliseconds())
				}
				what := map[int]string{0: "none", svPanic: "panic", svError: "error", svHang: "hang"}[code]
				if err != nil {
					say("err %s ms=%d at=%d poison=%s: %s", svKind(err), took.Milliseconds(), time.Now().UnixMilli(), what,
						strings.ReplaceAll(err.Error(), "\n", " "))
					if *into {
						retired[chunk] = true
					}
					continue
				}
				if code != 0 {
					say("wrong: a call whose row makes Forward %s was answered", what)
					continue
				}
				if msg := svCheck(model, in, out); msg != "" {
					say("wrong: %s", msg)
					continue
				}
				if now := time.Now(); now.Sub(last) > svGap {
					say("gap %d %d", last.UnixMilli(), now.UnixMilli())
				}
				last = time.Now()
				if k := oks.Add(1); k%20 == 0 {
					say("ok %d", k)
				}
			}
		})
	}
	wg.Wait()
	fmt.Println("final", "ok="+strconv.FormatInt(oks.Load(), 10))
	return nil
}

// svPredict runs in (n rows): Predict, or PredictInto on rows from start.
func svPredict(ctx context.Context, c *serve.Client, in *tensordict.TensorDict, n, start int, into bool) (*tensordict.TensorDict, error) {
	if !into {
		out, v, err := c.Predict(ctx, in)
		if err == nil && v != 1 {
			err = fmt.Errorf("version %d, want 1", v)
		}
		return out, err
	}
	if err := c.Input().SetSlice(start, in); err != nil {
		return nil, err
	}
	v, err := c.PredictInto(ctx, start, n)
	if err != nil {
		return nil, err
	}
	if v != 1 {
		return nil, fmt.Errorf("version %d, want 1", v)
	}
	out, err := c.Output().Slice(start, start+n)
	if err != nil {
		return nil, err
	}
	return out.Clone()
}

// svInput returns n rows of random inputs in [-1, 1).
func svInput(rng *rand.Rand, n int) *tensordict.TensorDict {
	xs := make([]float32, n*svSizes[0])
	for i := range xs {
		xs[i] = float32(2*rng.Float64() - 1)
	}
	x, _ := tensordict.FromSlice(xs, n, svSizes[0])
	td, _ := tensordict.New(n)
	td.Set(mlp.DefaultIn, x)
	return td
}

// svCheck compares the node's outputs with model's, and says how they
// differ ("" if they do not).
func svCheck(model *mlp.MLP, in, out *tensordict.TensorDict) string {
	want, err := model.Forward(context.Background(), in)
	if err != nil {
		return err.Error()
	}
	wt, _ := want.Tensor(mlp.DefaultOut)
	ws, _ := tensordict.Values[float32](wt)
	gt, err := out.Tensor(mlp.DefaultOut)
	if err != nil {
		return err.Error()
	}
	gs, err := tensordict.Values[float32](gt)
	if err != nil {
		return err.Error()
	}
	if len(gs) != len(ws) {
		return fmt.Sprintf("%d outputs, want %d", len(gs), len(ws))
	}
	for i := range ws {
		if d := math.Abs(float64(gs[i] - ws[i])); d > 1e-4*(1+math.Abs(float64(ws[i]))) || math.IsNaN(float64(gs[i])) {
			return fmt.Sprintf("output %d of %d: %v, want %v", i, len(ws), gs[i], ws[i])
		}
	}
	return ""
}

// svOwnFolder finds this process's slots folder under root: the one whose
// lock says "pid" and this process's id.
func svOwnFolder(root string) (string, error) {
	locks, _ := filepath.Glob(filepath.Join(root, filepath.FromSlash(serve.ClientsDir), "*", "lock"))
	for _, l := range locks {
		b, err := os.ReadFile(l)
		if err == nil && strings.Contains("\n"+string(b), fmt.Sprintf("\npid %d\n", os.Getpid())) {
			return filepath.Dir(l), nil
		}
	}
	return "", fmt.Errorf("no folder under %s has this process's lock", root)
}

// svPoisoned wraps the MLP: Forward misbehaves on a batch a row of which
// holds one of the codes in its first input.
type svPoisoned struct {
	*mlp.MLP
	gate string
}

func (p svPoisoned) Forward(ctx context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	x, err := in.Tensor(mlp.DefaultIn)
	if err != nil {
		return nil, err
	}
	xs, err := tensordict.Values[float32](x)
	if err != nil {
		return nil, err
	}
	for i := 0; i < len(xs); i += svSizes[0] {
		switch xs[i] {
		case svPanic:
			panic("injected panic")
		case svError:
			return nil, errors.New("injected failure")
		case svHang:
			for !fileExists(p.gate) {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
		}
	}
	return p.MLP.Forward(ctx, in)
}

// runServeNode serves the poisoned MLP as "policy", version 1, with two
// replicas, on -listen with -root, until its context ends; it prints
// nodeproc.ListeningPrefix and the address once it listens.
func runServeNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve-node", flag.ContinueOnError)
	listen := fs.String("listen", "", "where to listen")
	root := fs.String("root", "", "the shared root")
	tokenFile := fs.String("token-file", "", "the shared secret")
	if err := fs.Parse(args); err != nil {
		return err
	}
	shape, err := mlp.New(mlp.Config{Sizes: svSizes})
	if err != nil {
		return err
	}
	m, err := serve.New(serve.Config{
		Input: shape.Input(), Output: shape.Output(), MaxBatch: svMaxBatch, Replicas: 2, Lease: svLease,
		New: func(int) (serve.Model, error) {
			m, err := mlp.New(mlp.Config{Sizes: svSizes})
			return svPoisoned{m, filepath.Join(*root, "gate")}, err
		},
	})
	if err != nil {
		return err
	}
	defer m.Close()
	if _, err := m.Load(ctx, mlp.Random(svSizes, svSeed)); err != nil {
		return err
	}
	var svc *serve.Service
	defer func() {
		if svc != nil {
			svc.Close()
		}
	}()
	return nodeproc.Run(ctx, nodeproc.Config{
		Listen: *listen, Root: *root, TokenFile: *tokenFile,
		Register: func(s *rpc.Server) error {
			if svc, err = serve.Register(s); err != nil {
				return err
			}
			return svc.Add(svName, m)
		},
	}, func(addr string) { fmt.Println(nodeproc.ListeningPrefix + addr) })
}

// svClients are a scenario's client processes, by name.
type svClients map[string]*proctest.Proc

// start starts client name on a host of its own, which it returns; root
// "" is bytes mode.
func (cs svClients) start(t *testing.T, c *cluster, name, node, root, wantMode string, extra ...string) *netns.Host {
	t.Helper()
	h := c.host(name)
	args := append([]string{"-addr", node, "-token-file", c.token, "-root", root}, extra...)
	p := c.helper(h, "serve-client", "serve client "+name, args...)
	if mode := p.Expect(t, "ready"); mode != wantMode {
		t.Fatalf("client %s runs in %s mode, want %s", name, mode, wantMode)
	}
	cs[name] = p
	return h
}

// oks returns how many answers each client has had right.
func (cs svClients) oks() map[string]int {
	now := map[string]int{}
	for name, p := range cs {
		if ns := linesAfter(p.Output(), "ok "); len(ns) > 0 {
			now[name] = ns[len(ns)-1]
		}
	}
	return now
}

// check fails t if a client printed a wrong answer or a hung call, or
// exited.
func (cs svClients) check(t *testing.T, except ...string) {
	t.Helper()
	for name, p := range cs {
		for _, line := range strings.Split(p.Output(), "\n") {
			if strings.HasPrefix(line, "wrong") || strings.HasPrefix(line, "hang ") {
				t.Fatalf("client %s: %s", name, line)
			}
		}
		if !p.Alive() && !slices.Contains(except, name) {
			t.Fatalf("client %s exited: %v; stderr:\n%s", name, p.ExitErr(), p.Stderr())
		}
	}
}

// progress waits up to 60 s for each named client to have 40 more answers
// than in from, checking meanwhile that none went wrong.
func (cs svClients) progress(t *testing.T, what string, from map[string]int, names ...string) map[string]int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		cs.check(t, "victim")
		now := cs.oks()
		ok := true
		for _, n := range names {
			ok = ok && now[n] >= from[n]+40
		}
		if ok {
			return now
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: clients %v made no progress in 60 s: %v (from %v)", what, names, now, from)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// errs counts p's errors by kind, those of poisoned calls apart (kind
// "poisoned-KIND").
func svErrs(p *proctest.Proc) map[string]int {
	kinds := map[string]int{}
	for _, line := range strings.Split(p.Output(), "\n") {
		rest, ok := strings.CutPrefix(line, "err ")
		if !ok {
			continue
		}
		kind, _, _ := strings.Cut(rest, " ")
		if !strings.Contains(rest, "poison=none") {
			kind = "poisoned-" + kind
		}
		kinds[kind]++
	}
	return kinds
}

// svGaps returns p's pauses between answers, in Unix ms.
func svGaps(p *proctest.Proc) [][2]int64 {
	var gaps [][2]int64
	for _, line := range strings.Split(p.Output(), "\n") {
		var a, b int64
		if _, err := fmt.Sscanf(line, "gap %d %d", &a, &b); err == nil {
			gaps = append(gaps, [2]int64{a, b})
		}
	}
	return gaps
}

// svMonitor dials the node from the test process, by bytes, for its stats.
func svMonitor(t *testing.T, c *cluster, node string) *serve.Client {
	t.Helper()
	token, err := nodeproc.ReadToken(c.token)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := serve.Dial(ctx, node, svName, serve.WithRPC(rpc.WithToken(token)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// svWaitClients waits up to 60 s for the node to hold want registrations.
func svWaitClients(t *testing.T, m *serve.Client, want int, what string) {
	t.Helper()
	var st serve.Stats
	var err error
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err = m.Stats(ctx)
		cancel()
		if err == nil && st.Clients == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the node holds %d registrations (%v), want %d", what, st.Clients, err, want)
		}
	}
}

func TestServeAcrossHosts(t *testing.T) {
	c := newCluster(t)
	writeServeParams(t, c.shared)
	nodeHost := c.host("serve")
	node := addr(nodeHost)
	nodeArgs := []string{"--serve", fmt.Sprintf("%s,params=%s,max-batch=%d,replicas=2,lease=%v", svName, svName, svMaxBatch, svLease)}
	np := c.node(nodeHost, "", nodeArgs...)
	cs := svClients{}
	hosts := map[string]*netns.Host{}
	for _, cl := range []struct {
		name, root, mode string
		args             []string
	}{
		{"ref", c.shared, "ref", []string{"-workers", "2"}},
		{"into", c.shared, "ref", []string{"-into"}},
		{"bytes", "", "bytes", nil},
		{"cut", "", "bytes", nil},
		{"victim", c.shared, "ref", []string{"-workers", "4"}},
	} {
		hosts[cl.name] = cs.start(t, c, cl.name, node, cl.root, cl.mode, cl.args...)
	}
	victimDir := cs["victim"].Expect(t, "dir")
	mon := svMonitor(t, c, node)
	everyone := []string{"ref", "into", "bytes", "cut", "victim"}
	others := []string{"ref", "into", "bytes"}
	at := cs.progress(t, "at the start", nil, everyone...)
	svWaitClients(t, mon, 3, "at the start") // ref, into, victim

	// The victim dies with four calls in flight, by bell: the others go
	// on; its registration and folder go with its lease.
	killed := cs["victim"].Kill()
	at = cs.progress(t, "after the victim was killed", at, others...)
	svWaitClients(t, mon, 2, "after the victim's lease")
	for deadline := time.Now().Add(60 * time.Second); fileExists(victimDir); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the victim's folder %s is still there 60 s after it was killed", victimDir)
		}
	}
	victimGone := time.Since(killed)

	// The cut client's host is cut off until one of its calls has failed
	// by its deadline; the others go on meanwhile; reconnected, it
	// predicts again.
	cutErrs := len(svErrs(cs["cut"]))
	if err := hosts["cut"].Disconnect(); err != nil {
		t.Fatal(err)
	}
	cutAt := time.Now()
	at = cs.progress(t, "while the cut client is cut off", at, others...)
	for deadline := time.Now().Add(60 * time.Second); svCount(svErrs(cs["cut"])) == cutErrs; time.Sleep(50 * time.Millisecond) {
		cs.check(t, "victim")
		if time.Now().After(deadline) {
			t.Fatal("no call of the cut client failed in 60 s of partition")
		}
	}
	if err := hosts["cut"].Reconnect(); err != nil {
		t.Fatal(err)
	}
	cutFor := time.Since(cutAt)
	at = cs.progress(t, "after the partition healed", at, "cut")

	// The node dies, and comes back on the same address and root.
	// It stays down until every client has had a call fail by its
	// deadline: a restart quicker than that, clients ride out unseen.
	live := []string{"ref", "into", "bytes", "cut"}
	before := map[string]int{}
	for _, name := range live {
		before[name] = svCount(svErrs(cs[name]))
	}
	killedAt := np.Kill()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		cs.check(t, "victim")
		waiting := []string{}
		for _, name := range live {
			if svCount(svErrs(cs[name])) == before[name] {
				waiting = append(waiting, name)
			}
		}
		if len(waiting) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients %v saw no error in 60 s without a node", waiting)
		}
	}
	np = c.node(nodeHost, "", nodeArgs...)
	restarted := time.Now()
	t.Logf("node killed at %d, listening again at %d", killedAt.UnixMilli(), restarted.UnixMilli())
	nodeDown := restarted.Sub(killedAt)
	cs.progress(t, "after the node was killed and restarted", at, others...)
	cs.progress(t, "after the node was killed and restarted", at, "cut")
	svWaitClients(t, mon, 2, "after the node's restart") // ref and into registered again

	for _, name := range []string{"ref", "into", "bytes", "cut"} {
		if err := cs[name].Stop(30 * time.Second); err != nil {
			t.Fatalf("stopping client %s: %v", name, err)
		}
	}
	cs.check(t, "ref", "into", "bytes", "cut", "victim")
	// The kinds of errors each client saw: by its deadline while the node
	// was down or its host cut off (the call's context ended while it was
	// retrying: docs/serve.md, "Reconnection").
	var fig []any
	total := 0
	for _, name := range everyone {
		p := cs[name]
		kinds := svErrs(p)
		for _, line := range strings.Split(p.Output(), "\n") {
			if strings.HasPrefix(line, "err ") || strings.HasPrefix(line, "gap ") {
				t.Logf("client %s: %s", name, line)
			}
		}
		for kind, n := range kinds {
			if kind != "deadline" && kind != "unavailable" {
				t.Errorf("client %s: %d errors of kind %s, which no fault here explains", name, n, kind)
			}
		}
		// Recovery: from the node's listening again to the client's first
		// answer after it (0: before the test saw the node listen).
		var recovery int64
		for _, g := range svGaps(p) {
			if g[0] < restarted.UnixMilli() && g[1] >= killedAt.UnixMilli() {
				recovery = max(recovery, g[1]-restarted.UnixMilli())
			}
		}
		// Calls that failed once the node was back: by bell, waiting for
		// slots that calls which ended during the outage keep (the new
		// node never answers them; docs/serve.md, "A call that its
		// context ended").
		late := 0
		for _, line := range strings.Split(p.Output(), "\n") {
			for _, f := range strings.Fields(line) {
				if a, ok := strings.CutPrefix(f, "at="); ok && strings.HasPrefix(line, "err ") {
					if ms, _ := strconv.ParseInt(a, 10, 64); ms > restarted.UnixMilli() {
						late++
					}
				}
			}
		}
		oks := 0
		if ns := linesAfter(p.Output(), "ok "); len(ns) > 0 {
			oks = ns[len(ns)-1]
		}
		total += oks
		fig = append(fig, name+"_ok", oks, name+"_errors", fmtKinds(kinds))
		if name != "victim" {
			fig = append(fig, name+"_recovery_ms", recovery, name+"_errors_after_restart", late)
		}
		if n := svCount(kinds); name == "cut" && n == 0 {
			t.Errorf("the cut client saw no error in %v of partition", cutFor)
		}
	}
	fig = append(fig, "answers", total, "victim_folder_gone_after", victimGone.Round(10*time.Millisecond),
		"partition", cutFor.Round(10*time.Millisecond),
		"node_down", nodeDown.Round(10*time.Millisecond))
	figures(t, fig...)
	np.Stop(30 * time.Second)
}

// svCount adds up kinds.
func svCount(kinds map[string]int) int {
	n := 0
	for _, k := range kinds {
		n += k
	}
	return n
}

// fmtKinds prints kinds as kind:n,kind:n, sorted ("none" if empty).
func fmtKinds(kinds map[string]int) string {
	var parts []string
	for k, n := range kinds {
		parts = append(parts, fmt.Sprintf("%s:%d", k, n))
	}
	if len(parts) == 0 {
		return "none"
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// TestServeForwardFails: a node whose Forward panics or fails on some
// rows fails the batches holding them with serve.forward, and only those;
// a Forward that hangs holds one replica, whose batch's calls end by
// their deadlines, while the other replica serves everyone else. A
// poisoner (by reference, by bell) sends a row that makes Forward panic
// or fail in every fifth call, and first one that makes it hang until
// the test opens the gate; two honest clients (by reference and by
// bytes) predict meanwhile and check every answer.
func TestServeForwardFails(t *testing.T) {
	c := newCluster(t)
	nodeHost := c.host("serve")
	node := addr(nodeHost)
	np := c.helper(nodeHost, "serve-node", "faulty serve node", "-listen", node, "-root", c.shared, "-token-file", c.token)
	np.Expect(t, nodeproc.ListeningPrefix)
	cs := svClients{}
	cs.start(t, c, "ref", node, c.shared, "ref", "-workers", "2")
	cs.start(t, c, "bytes", node, "", "bytes")
	cs.start(t, c, "poisoner", node, c.shared, "ref", "-poison", "5", "-hang")
	everyone := []string{"ref", "bytes", "poisoner"}

	// The hung call ends by its deadline; everyone predicts meanwhile,
	// on the other replica.
	at := cs.progress(t, "with a replica hung", nil, everyone...)
	hung := false
	for _, line := range strings.Split(cs["poisoner"].Output(), "\n") {
		hung = hung || strings.HasPrefix(line, "err deadline") && strings.Contains(line, "poison=hang")
	}
	if !hung {
		t.Fatalf("the call that hangs Forward did not end by its deadline:\n%s", cs["poisoner"].Output())
	}
	if err := os.WriteFile(filepath.Join(c.shared, "gate"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cs.progress(t, "after the gate opened", at, everyone...)
	for _, name := range everyone {
		if err := cs[name].Stop(30 * time.Second); err != nil {
			t.Fatalf("stopping client %s: %v", name, err)
		}
	}
	cs.check(t, everyone...)
	if !np.Alive() {
		t.Fatalf("the node exited: %v", np.ExitErr())
	}

	// Every poisoned call failed with serve.forward (the hang by its
	// deadline), saying why; the honest calls failed only when they
	// shared a batch with a poisoned one: with serve.forward, or by their
	// deadlines in the hung batch.
	poisoner := svErrs(cs["poisoner"])
	var poisoned, panics, failures int
	for _, line := range strings.Split(cs["poisoner"].Output(), "\n") {
		switch {
		case strings.HasPrefix(line, "err forward") && strings.Contains(line, "poison=panic") && strings.Contains(line, "injected panic"):
			panics++
		case strings.HasPrefix(line, "err forward") && strings.Contains(line, "poison=error") && strings.Contains(line, "injected failure"):
			failures++
		}
	}
	poisoned = poisoner["poisoned-forward"]
	if panics+failures != poisoned || panics == 0 || failures == 0 {
		t.Errorf("poisoned calls: %d failed with serve.forward, %d of them saying the panic and %d the failure; want all, of both",
			poisoned, panics, failures)
	}
	if poisoner["poisoned-deadline"] != 1 {
		t.Errorf("%d poisoned calls ended by their deadline, want 1 (the hang)", poisoner["poisoned-deadline"])
	}
	honestForward, honestDeadline := 0, 0
	var fig []any
	for _, name := range everyone {
		kinds := svErrs(cs[name])
		for kind, n := range kinds {
			switch kind {
			case "forward":
				honestForward += n
			case "deadline":
				honestDeadline += n
			case "poisoned-forward", "poisoned-deadline":
			default:
				t.Errorf("client %s: %d errors of kind %s", name, n, kind)
			}
		}
		oks := 0
		if ns := linesAfter(cs[name].Output(), "ok "); len(ns) > 0 {
			oks = ns[len(ns)-1]
		}
		fig = append(fig, name+"_ok", oks, name+"_errors", fmtKinds(kinds))
	}
	if honestForward > poisoned*(svMaxBatch-1) || honestDeadline > svMaxBatch-1 {
		t.Errorf("honest calls failed: %d with serve.forward (%d poisoned calls, batches of %d), %d by their deadline (one hung batch)",
			honestForward, poisoned, svMaxBatch, honestDeadline)
	}
	figures(t, fig...)
	np.Stop(30 * time.Second)
}
