package rpc_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Scale multiplies rows of a TensorDict on the node that serves it.
type Scale struct {
	TD     rpc.TD  `codec:"td"`
	Factor float64 `codec:"factor"`
}

// A node serves a handler that takes a TensorDict; a client on the same
// filesystem calls it with a memory-mapped TensorDict, which travels as a
// reference: the handler writes the caller's file directly.
func Example() {
	root, _ := os.MkdirTemp("", "rpc-example")
	defer os.RemoveAll(root)
	ctx := context.Background()

	// Node B.
	srv, _ := rpc.NewServer(rpc.WithRoot(root))
	rpc.Register(srv, "scale", func(ctx context.Context, req Scale) (rpc.Empty, error) {
		x, err := req.TD.Tensor("x")
		if err != nil {
			return rpc.Empty{}, err
		}
		vals, err := tensordict.Values[float32](x)
		if err != nil {
			return rpc.Empty{}, err
		}
		for _, r := range req.TD.Rows {
			row, _ := x.Row(r)
			if err := row.Fill([]int{0}, float64(vals[r])*req.Factor); err != nil {
				return rpc.Empty{}, err
			}
		}
		return rpc.Empty{}, nil
	})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	// Node A.
	td, _ := tensordict.Create(filepath.Join(root, "data"), []int{4},
		tensordict.Field{Key: []string{"x"}, DType: memmap.Float32, Shape: []int{4, 1}})
	defer td.Close()
	td.Fill([]int{0, 1, 2, 3}, 3)
	c, err := rpc.Dial(ctx, l.Addr().String(), rpc.WithRoot(root))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	shared, _ := c.SharedFS(ctx)
	_, err = rpc.Call[rpc.Empty](ctx, c, "scale", Scale{TD: rpc.TD{TensorDict: td, Rows: []int{1, 3}, Out: true}, Factor: 2})
	x, _ := td.Tensor("x")
	vals, _ := tensordict.Values[float32](x)
	fmt.Println("shared filesystem:", shared, "error:", err)
	fmt.Println(vals)

	_, err = rpc.Call[rpc.Empty](ctx, c, "scale", Scale{TD: rpc.TD{TensorDict: td, Rows: []int{7}}})
	fmt.Println(err)
	// Output:
	// shared filesystem: true error: <nil>
	// [3 6 3 6]
	// rpc: InvalidArgument: TD rows: memmap: index out of range: row 7 (position 0) not in [0, 4)
}

// Announce is what a producer tells a consumer: a batch is ready in a slot.
type Announce struct {
	Slot  int `codec:"slot"`
	Epoch int `codec:"epoch"`
}

// Ack is a consumer's answer: it is done with a slot.
type Ack struct {
	Slot int `codec:"slot"`
}

// Subscribe opens a consumer's stream of announcements.
type Subscribe struct {
	Consumer string `codec:"consumer"`
	Batches  int    `codec:"batches"`
}

// A message stream carries typed messages both ways on one connection: a
// producer announces batches and waits for each consumer's ack, as a data
// loader does. The handler's return ends the stream; its error, or
// io.EOF, is what the caller's last Recv returns.
func Example_stream() {
	ctx := context.Background()
	srv, _ := rpc.NewServer()
	rpc.RegisterStream(srv, "loader.subscribe", func(ctx context.Context, req Subscribe, st *rpc.ServerStream[Ack, Announce]) error {
		for i := range req.Batches {
			if err := st.Send(ctx, Announce{Slot: i % 2, Epoch: 0}); err != nil {
				return err
			}
			ack, err := st.Recv(ctx) // back-pressure: one batch in flight
			if err != nil {
				return err
			}
			fmt.Printf("%s released slot %d\n", req.Consumer, ack.Slot)
		}
		return nil
	})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	c, err := rpc.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	st, err := rpc.OpenStream[Ack, Announce](ctx, c, "loader.subscribe", Subscribe{Consumer: "c1", Batches: 3})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer st.Close()
	for {
		a, err := st.Recv(ctx)
		if err == io.EOF {
			fmt.Println("producer done")
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("batch in slot", a.Slot)
		if err := st.Send(ctx, Ack{Slot: a.Slot}); err != nil {
			fmt.Println(err)
			return
		}
	}
	// Output:
	// batch in slot 0
	// c1 released slot 0
	// batch in slot 1
	// c1 released slot 1
	// batch in slot 0
	// c1 released slot 0
	// producer done
}

// Save keeps a TensorDict on the node under a name.
type Save struct {
	Name string `codec:"name"`
	TD   rpc.TD `codec:"td"`
}

// A node that keeps what it is sent has the bytes written into files as
// they arrive (PlaceBytes), and keeps the folder by renaming it; a caller
// on another filesystem sends the same call as before.
func ExamplePlaceBytes() {
	dir, _ := os.MkdirTemp("", "rpc-place")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	os.Mkdir(filepath.Join(dir, "incoming"), 0o755)
	os.Mkdir(filepath.Join(dir, "kept"), 0o755)

	srv, _ := rpc.NewServer()
	rpc.Register(srv, "save", func(ctx context.Context, req Save) (rpc.Empty, error) {
		// req.TD is mapped from the folder PlaceBytes named, its files
		// written but not synced: sync it (tensordict.SyncPrefix) to make it
		// durable, then move it to keep it.
		if err := tensordict.SyncPrefix(req.TD.Prefix()); err != nil {
			return rpc.Empty{}, err
		}
		return rpc.Empty{}, os.Rename(req.TD.Prefix(), filepath.Join(dir, "kept", req.Name))
	}, rpc.PlaceBytes(func(req *Save, td *rpc.TD, l rpc.Layout) (rpc.Placement, error) {
		if !filepath.IsLocal(req.Name) {
			return rpc.Placement{}, rpc.Errorf(rpc.InvalidArgument, "save: a name that is not a file name")
		}
		return rpc.Placement{Prefix: filepath.Join(dir, "incoming", req.Name), Writeback: true}, nil
	}))
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	c, err := rpc.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	x, _ := tensordict.FromSlice([]float32{1, 2, 3, 4}, 4)
	td, _ := tensordict.New(4)
	td.Set("x", x)
	_, err = rpc.Call[rpc.Empty](ctx, c, "save", Save{Name: "run1", TD: rpc.Ref(td)})
	fmt.Println("saved:", err)

	kept, err := tensordict.LoadMemmap(filepath.Join(dir, "kept", "run1"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer kept.Close()
	y, _ := kept.Tensor("x")
	vals, _ := tensordict.Values[float32](y)
	left, _ := os.ReadDir(filepath.Join(dir, "incoming"))
	fmt.Println(vals, "left in incoming:", len(left))
	// Output:
	// saved: <nil>
	// [1 2 3 4] left in incoming: 0
}

// Batch is the response of "next" in ExampleCallInto.
type Batch struct {
	Step int
	TD   rpc.TD
}

// A loop that receives a batch of the same layout on every call reads each
// one into the same TensorDict: no batch is allocated after the first.
func ExampleCallInto() {
	ctx := context.Background()
	srv, _ := rpc.NewServer()
	rpc.Register(srv, "next", func(ctx context.Context, step int) (Batch, error) {
		x, _ := tensordict.FromSlice([]float32{float32(step), float32(10 * step)}, 2)
		td, _ := tensordict.New(2)
		td.Set("x", x)
		return Batch{Step: step, TD: rpc.Ref(td)}, nil
	})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	c, err := rpc.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	x, _ := tensordict.Zeros(memmap.Float32, 2)
	dst, _ := tensordict.New(2)
	dst.Set("x", x)
	for step := 1; step <= 3; step++ {
		b, err := rpc.CallInto[Batch](ctx, c, "next", step, dst)
		if err != nil {
			fmt.Println(err)
			return
		}
		vals, _ := tensordict.Values[float32](x)
		fmt.Println(b.Step, vals, "in dst:", b.TD.TensorDict == dst)
	}
	// Output:
	// 1 [1 10] in dst: true
	// 2 [2 20] in dst: true
	// 3 [3 30] in dst: true
}

// Frame is a stream message carrying one TensorDict by bytes.
type Frame struct {
	N  int    `codec:"n"`
	TD rpc.TD `codec:"td"`
}

// A node sends the same batch to every stream that asks for it: with a
// Seal on the TD, the first Send that compresses makes the LZ4 frame and
// the others write it as it is. The bytes must not change while the seal
// is in use; Reset it before they do.
func ExampleSeal() {
	ctx := context.Background()
	batch, _ := tensordict.New(64)
	obs, _ := tensordict.Zeros(memmap.Uint8, 64, 84, 84) // compresses: every pixel 0
	batch.Set("obs", obs)
	seal := new(rpc.Seal)

	srv, _ := rpc.NewServer()
	rpc.RegisterStream(srv, "batches", func(ctx context.Context, _ rpc.Empty, st *rpc.ServerStream[rpc.Empty, Frame]) error {
		return st.Send(ctx, Frame{N: 64, TD: rpc.TD{TensorDict: batch, Seal: seal}})
	})
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(l)
	defer srv.Close()

	for range 3 { // three consumers, one compression
		c, err := rpc.Dial(ctx, l.Addr().String())
		if err != nil {
			fmt.Println(err)
			return
		}
		st, err := rpc.OpenStream[rpc.Empty, Frame](ctx, c, "batches", rpc.Empty{})
		if err != nil {
			fmt.Println(err)
			return
		}
		f, err := st.Recv(ctx)
		if err != nil {
			fmt.Println(err)
			return
		}
		got, _ := f.TD.Tensor("obs")
		fmt.Println(f.N, got.Shape())
		st.Close()
		c.Close()
	}
	// Before the batch's bytes are written again (no Send holds the seal):
	seal.Reset()
	// Output:
	// 64 [64 84 84]
	// 64 [64 84 84]
	// 64 [64 84 84]
}
