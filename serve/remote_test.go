package serve

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/testkit/proctest"
	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// node is a manager served by an rpc server in this process.
type node struct {
	addr string
	m    *Manager
	svc  *Service
	srv  *rpc.Server
}

// serveModel serves a manager of cfg as "model" on a loopback port, with
// root as the server's root ("" for none).
func serveModel(t *testing.T, root string, cfg Config) *node {
	t.Helper()
	return serveModelB(t, root, cfg)
}

// serveModelB is serveModel for tests and benchmarks.
func serveModelB(t testing.TB, root string, cfg Config) *node {
	t.Helper()
	var opts []rpc.Option
	if root != "" {
		opts = append(opts, rpc.WithRoot(root))
	}
	srv, err := rpc.NewServer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Register(srv)
	if err != nil {
		t.Fatal(err)
	}
	m := newManager(t, cfg)
	if err := svc.Add("model", m); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &node{addr: l.Addr().String(), m: m, svc: svc, srv: srv}
}

// dial dials the model in mode "ref" (sharing root) or "bytes".
func dial(t *testing.T, addr, root, mode string, opts ...DialOption) *Client {
	t.Helper()
	opts = append(opts, WithRoot(root))
	if mode == "bytes" {
		opts = append(opts, WithBytes())
	}
	c, err := Dial(ctxT(t), addr, "model", opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c.Mode() != mode {
		t.Fatalf("mode %s, want %s", c.Mode(), mode)
	}
	return c
}

func TestRemote_Predict(t *testing.T) {
	for _, mode := range []string{"ref", "bytes"} {
		t.Run(mode, func(t *testing.T) {
			root := t.TempDir()
			n := serveModel(t, root, testConfig(&behaviour{}, 8))
			c := dial(t, n.addr, root, mode, WithSlots(16))
			if c.Slots() != 16 || c.MaxBatch() != 8 {
				t.Fatalf("slots %d, max batch %d", c.Slots(), c.MaxBatch())
			}
			out, v, err := c.Predict(ctxT(t), rowsOf(t, 5, 3))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := checkOutputs(out, 5, 3, 0); err != nil || v != 0 {
				t.Fatalf("version %d, %v", v, err)
			}
			if _, err := n.m.Load(ctxT(t), params(t, 1000)); err != nil {
				t.Fatal(err)
			}
			// Many at once, through Go: more than the slots hold at a time.
			var calls []*Call
			for i := range 20 {
				calls = append(calls, c.Go(ctxT(t), rowsOf(t, 10*i, 1+i%4)))
			}
			for i, call := range calls {
				out, v, err := call.Wait()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := checkOutputs(out, 10*i, 1+i%4, 1000); err != nil || v != 1 {
					t.Errorf("call %d: version %d, %v", i, v, err)
				}
			}
			// In place.
			if err := c.Input().SetSlice(4, rowsOf(t, 7, 2)); err != nil {
				t.Fatal(err)
			}
			v, err = c.PredictInto(ctxT(t), 4, 2)
			if err != nil || v != 1 {
				t.Fatalf("PredictInto: version %d, %v", v, err)
			}
			rows, _ := c.Output().Slice(4, 6)
			if _, err := checkOutputs(rows, 7, 2, 1000); err != nil {
				t.Error(err)
			}
			st, err := c.Stats(ctxT(t))
			if err != nil {
				t.Fatal(err)
			}
			if want := map[string]int{"ref": 1, "bytes": 0}[mode]; st.Clients != want || st.Requests != 22 {
				t.Errorf("stats %+v: want %d clients, 22 requests", st, want)
			}
		})
	}
}

// TestRemote_NoRowBytesByReference counts the bytes that cross the
// network: by reference a request is a few dozen bytes, whatever its rows;
// in bytes mode the rows cross.
func TestRemote_NoRowBytesByReference(t *testing.T) {
	root := t.TempDir()
	wide := tensordict.RowSchema{{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{4096}}}
	cfg := testConfig(&behaviour{}, 8)
	cfg.Input = wide
	cfg.New = func(int) (Model, error) { return wideModel{}, nil }
	n := serveModel(t, root, cfg)
	up := map[string]int64{}
	for _, mode := range []string{"ref", "bytes"} {
		p := proctest.StartProxy(t, n.addr)
		c := dial(t, p.Addr, root, mode)
		in, _ := wide.Zeros(8)
		x, _ := in.Tensor("x")
		xb, _ := x.Bytes()
		rand.Read(xb) // random: rpc's lz4 does not shrink it
		p.Up.Store(0)
		for range 10 {
			if _, _, err := c.Predict(ctxT(t), in); err != nil {
				t.Fatal(err)
			}
		}
		c.Close() // and the proxy's counts complete once its connections end
		p.WaitIdle(t)
		up[mode] = p.Up.Load()
	}
	t.Logf("10 predictions of 8 rows of 16 KiB, and Close: %d bytes up by reference, %d by bytes", up["ref"], up["bytes"])
	if up["ref"] > 10*300 || up["bytes"] < 10*8*4096*4 {
		t.Errorf("bytes up: ref %d, bytes %d", up["ref"], up["bytes"])
	}
}

// wideModel maps {"x": float32[4096]} to {"y": float32[2]} of zeros.
type wideModel struct{}

func (wideModel) Forward(_ context.Context, in *tensordict.TensorDict) (*tensordict.TensorDict, error) {
	return testOut.Zeros(in.BatchSize()[0])
}

func TestRemote_BadInput(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	for _, mode := range []string{"ref", "bytes"} {
		c := dial(t, n.addr, root, mode, WithSlots(2))
		f64, _ := tensordict.FromSlice(make([]float64, 4), 1, 4)
		wrong, _ := tensordict.New(1)
		wrong.Set("x", f64)
		for name, in := range map[string]*tensordict.TensorDict{"wrong dtype": wrong, "more rows than the slots": rowsOf(t, 0, 3)} {
			if _, _, err := c.Predict(ctxT(t), in); !errors.Is(err, ErrSchema) {
				t.Errorf("%s %s: %v, want ErrSchema", mode, name, err)
			}
		}
		if _, err := c.PredictInto(ctxT(t), 1, 2); !errors.Is(err, ErrSchema) {
			t.Errorf("%s: PredictInto past the slots: %v, want ErrSchema", mode, err)
		}
	}

	// The node checks what a client does not: requests sent as they are.
	rc, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f64, _ := tensordict.FromSlice(make([]float64, 4), 1, 4)
	wrong, _ := tensordict.New(1)
	wrong.Set("x", f64)
	c := dial(t, n.addr, root, "ref", WithSlots(2))
	id := c.id
	for name, req := range map[string]any{
		"wrong schema":             predictRequest{Name: "model", N: 1, In: &rpc.TD{TensorDict: wrong}},
		"no rows":                  predictRequest{Name: "model", N: 1},
		"more than the max batch":  predictRequest{Name: "model", N: 5, In: &rpc.TD{TensorDict: rowsOf(t, 0, 5)}},
		"past the slots":           predictRequest{Name: "model", Client: id, Start: 1, N: 2},
		"negative start":           predictRequest{Name: "model", Client: id, Start: -1, N: 1},
		"a folder of another form": registerRequest{Name: "model", Prefix: "../../etc", Slots: 1},
		"a folder that is not":     registerRequest{Name: "model", Prefix: ClientsDir + "/0123456789abcdef", Slots: 1},
		"wrong slots":              registerRequest{Name: "model", Prefix: c.rel, Slots: 3},
	} {
		method := MethodPredict
		if _, ok := req.(registerRequest); ok {
			method = MethodRegister
		}
		var err error
		switch r := req.(type) {
		case predictRequest:
			_, err = rpc.Call[predictResponse](ctxT(t), rc, method, r)
		case registerRequest:
			_, err = rpc.Call[registerResponse](ctxT(t), rc, method, r)
		}
		if !errors.Is(err, ErrSchema) || !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrSchema (InvalidArgument)", name, err)
		}
	}
	if st := n.m.Stats(); st.Requests != 0 {
		t.Errorf("%d requests queued, want none", st.Requests)
	}
	if _, err := Dial(ctxT(t), n.addr, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Dial of an unknown model: %v, want ErrNotFound", err)
	}
}

func TestRemote_Errors(t *testing.T) {
	root := t.TempDir()
	b := &behaviour{}
	cfg := testConfig(b, 2)
	cfg.MaxQueue = 2
	b.gate = make(chan struct{})
	b.started = make(chan int, 10)
	n := serveModel(t, root, cfg)
	c := dial(t, n.addr, root, "ref", WithSlots(8))
	first := c.Go(ctxT(t), rowsOf(t, 0, 1))
	<-b.started
	queued := c.Go(ctxT(t), rowsOf(t, 1, 2))
	poll(t, "2 rows queued", func() bool { return n.m.Stats().Queued == 2 })
	_, _, err := c.Predict(ctxT(t), rowsOf(t, 2, 1))
	if !errors.Is(err, ErrQueueFull) || !errors.Is(err, rpc.ErrResourceExhausted) {
		t.Errorf("queue full: %v, want ErrQueueFull (ResourceExhausted)", err)
	}
	b.fail.Store(2)
	close(b.gate)
	if _, _, err := first.Wait(); !errors.Is(err, ErrForward) || !errors.Is(err, rpc.ErrInternal) {
		t.Errorf("panicking forward: %v, want ErrForward (Internal)", err)
	}
	if _, _, err := queued.Wait(); err != nil {
		t.Errorf("the next batch: %v", err)
	}
}

// TestRemote_LeaseRunsOut: a registration nobody renews is dropped after
// the lease, and the folder of a client whose lock is free (dead) is
// removed; a live client whose registration was dropped registers again.
func TestRemote_LeaseRunsOut(t *testing.T) {
	root := t.TempDir()
	cfg := testConfig(&behaviour{}, 4)
	cfg.Lease = 200 * time.Millisecond
	n := serveModel(t, root, cfg)
	live := dial(t, n.addr, root, "ref")

	// A dead client's folder: made as a client makes it, lock free.
	dead := filepath.Join(root, ClientsDir, "00000000000000aa")
	if err := os.MkdirAll(dead, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range []struct {
		name   string
		schema tensordict.RowSchema
	}{{"in", testIn}, {"out", testOut}} {
		td, err := s.schema.Create(filepath.Join(dead, s.name), 4)
		if err != nil {
			t.Fatal(err)
		}
		td.Close()
	}
	rc, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	r, err := rpc.Call[registerResponse](ctxT(t), rc, MethodRegister,
		registerRequest{Name: "model", Prefix: ClientsDir + "/00000000000000aa", Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	poll(t, "the dead client's folder to go", func() bool {
		_, err := os.Stat(dead)
		return errors.Is(err, os.ErrNotExist)
	})
	_, err = rpc.Call[predictResponse](ctxT(t), rc, MethodPredict, predictRequest{Name: "model", Client: r.Client, N: 1})
	if !errors.Is(err, ErrNotRegistered) {
		t.Errorf("predict after the lease ran out: %v, want ErrNotRegistered", err)
	}
	// The live client renews, and its folder stays.
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("the live client's folder: %v", err)
	}
	if _, _, err := live.Predict(ctxT(t), rowsOf(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	if st := n.m.Stats(); st.Requests != 1 {
		t.Errorf("stats %+v", st)
	}
	// The live client is registered: the dead one's registration is gone,
	// and the live one's is there, or comes back at its next renewal. A
	// 200 ms lease can run out under load between two statements here (a
	// process not run for 150 ms misses three renewals): what a client
	// relies on is that it registers again, not that it never lapses.
	poll(t, "the live client, and only it, to be registered", func() bool {
		st, err := live.Stats(ctxT(t))
		return err == nil && st.Clients == 1
	})
}

// TestRemote_RegistersAgain: a node that lost the client's registration
// (here: the model served anew) gets it again at the client's next call.
func TestRemote_RegistersAgain(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	c := dial(t, n.addr, root, "ref")
	if _, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 1)); err != nil {
		t.Fatal(err)
	}
	n.svc.Remove("model")
	if err := n.svc.Add("model", n.m); err != nil {
		t.Fatal(err)
	}
	old := c.id
	out, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkOutputs(out, 1, 1, 0); err != nil {
		t.Error(err)
	}
	if c.id == old {
		t.Error("the client did not register again")
	}
}

// TestRemote_CloseRemovesTheSlots: Close unregisters and removes the
// client's folder; calls after it fail with ErrClosed.
func TestRemote_CloseRemovesTheSlots(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	c, err := Dial(ctxT(t), n.addr, "model", WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	dir := c.dir
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { c.Predict(ctxT(t), rowsOf(t, i, 1)) })
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the client's folder after Close: %v", err)
	}
	if _, _, err := c.Predict(ctxT(t), rowsOf(t, 1, 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Predict after Close: %v, want ErrClosed", err)
	}
	poll(t, "the node to drop the registration", func() bool {
		s, _ := n.svc.lookup("model")
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.clients) == 0
	})
}

// TestRemote_RegisterRefusalsSayWhatIsWrong registers client folders whose
// slots do not fit the model with a node: each refusal is ErrSchema
// (InvalidArgument) and says what is wrong: which slots (input or output),
// which key, its dtype or shape and the model's. Before, each began with
// "input does not match the model", output slots' too, and a missing key
// was only a count of fields.
func TestRemote_RegisterRefusalsSayWhatIsWrong(t *testing.T) {
	root := t.TempDir()
	n := serveModel(t, root, testConfig(&behaviour{}, 4))
	rc, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	field := func(key string, dt memmap.DType, shape ...int) tensordict.Field {
		return tensordict.Field{Key: []string{key}, DType: dt, Shape: shape}
	}
	goodIn := []tensordict.Field{field("x", memmap.Float32, 2, 4)}
	goodOut := []tensordict.Field{field("y", memmap.Float32, 2, 2)}
	for i, tc := range []struct {
		name    string
		in, out []tensordict.Field
		slots   int
		want    []string // in the message
		notWant string
	}{
		{"input dtype", []tensordict.Field{field("x", memmap.Float64, 2, 4)}, goodOut, 2,
			[]string{"input slots", "[x]", "torch.float64", "torch.float32"}, ""},
		{"output shape", goodIn, []tensordict.Field{field("y", memmap.Float32, 2, 3)}, 2,
			[]string{"output slots", "[y]", "[3]", "[2]"}, "input"},
		{"input key missing", []tensordict.Field{field("z", memmap.Float32, 2, 4)}, goodOut, 2,
			[]string{"input slots", "[z]", "[x]"}, ""},
		{"output key extra", goodIn, []tensordict.Field{field("y", memmap.Float32, 2, 2), field("w", memmap.Float32, 2, 1)}, 2,
			[]string{"output slots", "[w]"}, "input"},
		{"output key missing", goodIn, []tensordict.Field{field("v", memmap.Float32, 2, 2)}, 2,
			[]string{"output slots", "[y] is missing", "[v]"}, "input"},
		{"slots", goodIn, goodOut, 3,
			[]string{"input slots", "batch size [2]", "[3]"}, ""},
	} {
		rel := fmt.Sprintf("%s/%016x", ClientsDir, i+1)
		dir := filepath.Join(root, filepath.FromSlash(rel))
		for _, part := range []struct {
			name   string
			fields []tensordict.Field
		}{{"in", tc.in}, {"out", tc.out}} {
			td, err := tensordict.Create(filepath.Join(dir, part.name), []int{2}, part.fields...)
			if err != nil {
				t.Fatal(err)
			}
			td.Close()
		}
		_, err := rpc.Call[registerResponse](ctxT(t), rc, MethodRegister, registerRequest{Name: "model", Prefix: rel, Slots: tc.slots})
		if !errors.Is(err, ErrSchema) || !errors.Is(err, rpc.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrSchema (InvalidArgument)", tc.name, err)
			continue
		}
		msg := err.Error()
		for _, w := range tc.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not say %q", tc.name, msg, w)
			}
		}
		if tc.notWant != "" && strings.Contains(msg, tc.notWant) {
			t.Errorf("%s: %q speaks of %q", tc.name, msg, tc.notWant)
		}
	}
}
