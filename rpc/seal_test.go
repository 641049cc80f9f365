package rpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// TestSeal: streams that send the same TDs with a Seal compress each body
// once between them, and every peer gets every message's bytes, whether
// its stream compresses or not; after Reset, bytes written into the same
// memory are compressed again (no stale frame), and a seal given a body
// of another length is made again for it.
func TestSeal(t *testing.T) {
	const msgs = 6
	n := startStreamNode(t)
	var (
		mu    sync.Mutex
		tds   []*tensordict.TensorDict
		seals []*Seal
	)
	fill := func(gen int) {
		mu.Lock()
		defer mu.Unlock()
		if tds == nil {
			tds, seals = make([]*tensordict.TensorDict, msgs), make([]*Seal, msgs)
			for i := range msgs {
				tds[i], seals[i] = atariTD(8), new(Seal)
			}
		}
		for i := range msgs {
			// Frames 8k to 8k+7 of a game, k one per message and
			// generation: each body its own.
			k := i + msgs*gen
			b, _ := firstLeaf(t, tds[i]).Bytes()
			copy(b, atariFrames(8 * (k + 1))[k*len(b):])
			seals[i].Reset()
		}
	}
	want := func(i int) []byte {
		mu.Lock()
		defer mu.Unlock()
		b, _ := firstLeaf(t, tds[i]).Bytes()
		return bytes.Clone(b)
	}
	var runMixed func(t *testing.T, streams []func() (*Client, context.Context), nSliced int)
	must(t, RegisterStream(n.s, "test.stream.sealed", func(ctx context.Context, req tick, st *ServerStream[tick, tick]) error {
		for i := range msgs {
			td := tds[i]
			if req.I == 1 && i == msgs-1 {
				var err error
				if td, err = td.Slice(0, 4); err != nil { // a body of another length through the same seal
					return err
				}
			}
			if err := st.Send(ctx, tick{I: i, X: TD{TensorDict: td, Seal: seals[i]}}); err != nil {
				return err
			}
		}
		return nil
	}))
	// run runs the streams at once, every one sliced or none; runMixed
	// with the first nSliced sliced.
	run := func(t *testing.T, streams []func() (*Client, context.Context), sliced bool) {
		t.Helper()
		runMixed(t, streams, map[bool]int{false: 0, true: len(streams)}[sliced])
	}
	runMixed = func(t *testing.T, streams []func() (*Client, context.Context), nSliced int) {
		t.Helper()
		full := make([][]byte, msgs)
		for i := range msgs {
			full[i] = want(i)
		}
		var wg sync.WaitGroup
		errs := make(chan error, len(streams))
		for si, open := range streams {
			sliced := si < nSliced
			wants := full
			if sliced {
				wants = append([][]byte(nil), full...)
				wants[msgs-1] = wants[msgs-1][:len(wants[msgs-1])/2]
			}
			c, ctx := open()
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := tick{}
				if sliced {
					req.I = 1
				}
				st, err := OpenStream[tick, tick](ctx, c, "test.stream.sealed", req)
				if err != nil {
					errs <- err
					return
				}
				defer st.Close()
				for i := range msgs {
					m, err := st.Recv(ctx)
					if err != nil {
						errs <- err
						return
					}
					if b, _ := firstLeaf(t, m.X.TensorDict).Bytes(); m.I != i || !bytes.Equal(b, wants[i]) {
						errs <- fmt.Errorf("message %d (%d): %d bytes, not the TD's %d", i, m.I, len(b), len(wants[i]))
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	on := func() (*Client, context.Context) { return dial(t, n.addr), testCtx(t) }
	off := func() (*Client, context.Context) { return dial(t, n.addr, WithCompression(false)), testCtx(t) }
	uncompressed := func() (*Client, context.Context) { return dial(t, n.addr), Uncompressed(testCtx(t)) }

	for gen, tc := range []struct {
		name    string
		streams []func() (*Client, context.Context)
	}{
		{"four compressed streams", []func() (*Client, context.Context){on, on, on, on}},
		{"and streams that do not compress", []func() (*Client, context.Context){on, off, uncompressed, on}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fill(gen)
			before := sealsMade.Load()
			run(t, tc.streams, false)
			if made := sealsMade.Load() - before; made != msgs {
				t.Fatalf("%d bodies compressed through the seals, want %d", made, msgs)
			}
		})
	}
	t.Run("two lengths through a seal at once", func(t *testing.T) {
		// A seal made again for the other length while sends of the first
		// still write their frame: each keeps its own (the race detector
		// sees one written over the other).
		fill(3)
		for range 4 {
			runMixed(t, []func() (*Client, context.Context){on, on, on, on}, 2)
		}
	})
	t.Run("a shorter body through a seal", func(t *testing.T) {
		fill(2)
		for _, step := range []struct {
			sliced bool
			made   int64
		}{{false, msgs}, {true, 1}, {true, 0}, {false, 1}} {
			before := sealsMade.Load()
			run(t, []func() (*Client, context.Context){on}, step.sliced)
			if made := sealsMade.Load() - before; made != step.made {
				t.Fatalf("sliced %v: %d bodies compressed through the seals, want %d", step.sliced, made, step.made)
			}
		}
	})
}
