//go:build unix

package serve

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/internal/lockfile"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Lanes (lane.go) from Go: a replica here is a folder under the node's
// root, made by the test as a Python replica makes it (in, out, lock and
// the two FIFOs), and a serve.replica stream asking for its lane; it runs
// the batch frames it reads with a testModel, or does what each test
// says. python/tests/test_replica_lane.py runs torch modules so.

// laneReplica is a replica by reference with a lane, run by a test.
type laneReplica struct {
	st       *rpc.Stream[replicaAnswer, replicaBatch]
	dir      string
	in, out  *tensordict.TensorDict
	outF     fields
	batches  *os.File    // the replica's read end
	answers  *os.File    // its read-write end
	gotFrame chan [3]int // (batch, row, n) of each frame read
}

// makeLaneFolder makes a replica's folder under root for window lanes of
// the config's max batch, with the lane's FIFOs unless fifos is false
// (then regular files of those names), and returns its name under the
// root.
func makeLaneFolder(t *testing.T, root string, cfg Config, window int, fifos bool) (rel, dir string) {
	t.Helper()
	rel = ClientsDir + "/000000000000" + hex.EncodeToString([]byte{byte(window), byte(len(t.Name()))})
	dir = filepath.Join(root, filepath.FromSlash(rel))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	lock, err := lockfile.Acquire(filepath.Join(dir, "lock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Release() })
	for _, f := range []struct {
		name   string
		schema tensordict.RowSchema
	}{{"in", cfg.Input}, {"out", cfg.Output}} {
		td, err := f.schema.Create(filepath.Join(dir, f.name), window*cfg.MaxBatch)
		if err != nil {
			t.Fatal(err)
		}
		td.Close()
	}
	for _, name := range []string{laneBatches, laneAnswers} {
		var err error
		if fifos {
			err = syscall.Mkfifo(filepath.Join(dir, name), 0o600)
		} else {
			err = os.WriteFile(filepath.Join(dir, name), nil, 0o600)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return rel, dir
}

// attachLane makes a folder (makeLaneFolder) and opens a serve.replica
// stream asking for its lane, holding the FIFOs' ends as a Python replica
// does.
func attachLane(t *testing.T, n *node, root string, window int, fifos bool) *laneReplica {
	t.Helper()
	cfg := n.m.cfg
	rel, dir := makeLaneFolder(t, root, cfg, window, fifos)
	r := &laneReplica{dir: dir, gotFrame: make(chan [3]int, 16)}
	var err error
	if fifos {
		if r.batches, err = os.OpenFile(filepath.Join(dir, laneBatches), os.O_RDONLY|syscall.O_NONBLOCK, 0); err != nil {
			t.Fatal(err)
		}
		if r.answers, err = os.OpenFile(filepath.Join(dir, laneAnswers), os.O_RDWR, 0); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.closeLane)
	}
	if r.in, err = tensordict.LoadMemmap(filepath.Join(dir, "in")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.in.Close() })
	if r.out, err = tensordict.LoadMemmap(filepath.Join(dir, "out")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.out.Close() })
	if r.outF, err = fieldsOf(r.out, cfg.Output); err != nil {
		t.Fatal(err)
	}
	c, err := rpc.Dial(ctxT(t), n.addr, rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r.st, err = rpc.OpenStream[replicaAnswer, replicaBatch](ctxT(t), c, MethodReplica,
		replicaRequest{Name: "model", Prefix: rel, Window: window, Lane: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.st.Close() })
	return r
}

// first reads the stream's first message: the node's laneAck, or a batch
// when the node took no lane.
func (r *laneReplica) first(t *testing.T) replicaBatch {
	t.Helper()
	b, err := r.st.Recv(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// closeLane closes the replica's ends of its FIFOs, as its process's
// death does.
func (r *laneReplica) closeLane() {
	r.batches.Close()
	r.answers.Close()
}

// readFrame reads the next batch frame: (batch, row, n), or the error
// (io.EOF when the node closed its end).
func (r *laneReplica) readFrame() (uint64, int, int, error) {
	var b [laneBatchSize]byte
	if _, err := io.ReadFull(r.batches, b[:]); err != nil {
		return 0, 0, 0, err
	}
	le := binary.LittleEndian
	batch, row, n := le.Uint64(b[0:]), int(le.Uint32(b[8:])), int(le.Uint32(b[12:]))
	select {
	case r.gotFrame <- [3]int{int(batch), row, n}:
	default: // a test that reads none of them
	}
	return batch, row, n, nil
}

// forward writes the testModel's outputs of the in rows [row, row+n) into
// the same out rows, as a replica does before it answers.
func (r *laneReplica) forward(row, n int) error {
	in, err := r.in.Slice(row, row+n)
	if err != nil {
		return err
	}
	out, err := (&testModel{b: &behaviour{}}).Forward(context.Background(), in)
	if err != nil {
		return err
	}
	src, err := fieldsOf(out, testOut)
	if err != nil {
		return err
	}
	return copyRows(r.outF, row, src, 0, n)
}

// run answers every batch frame until the lane ends, computing the
// testModel's outputs into the out rows, with version; answer, when set,
// decides each answer's error ("" none) or, returning stop, to read no
// more frames.
func (r *laneReplica) run(version uint64, answer func(batch uint64, n int) (errMsg string, stop bool)) <-chan error {
	done := make(chan error, 1)
	go func() {
		for {
			batch, row, n, err := r.readFrame()
			if err != nil {
				done <- err
				return
			}
			var msg string
			if answer != nil {
				var stop bool
				if msg, stop = answer(batch, n); stop {
					done <- nil
					return
				}
			}
			if msg == "" {
				if err := r.forward(row, n); err != nil {
					msg = err.Error()
				}
			}
			if _, err := r.answers.Write(appendLaneAnswer(nil, replicaAnswer{Batch: batch, Version: version, Error: msg})); err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

func laneNode(t *testing.T, maxBatch int) (*node, string) {
	t.Helper()
	root := t.TempDir()
	cfg := attachedConfig(maxBatch)
	cfg.AttachWait = 5 * time.Second
	return serveModel(t, root, cfg), root
}

// TestLane_Predicts: a replica that asks for a lane gets the node's
// laneAck first, then its batches as frames, each in its lane's rows;
// its answers through the lane reach the callers with its version, and
// nothing else travels on the stream.
func TestLane_Predicts(t *testing.T) {
	for _, window := range []int{1, 2} {
		t.Run(map[int]string{1: "window 1", 2: "window 2"}[window], func(t *testing.T) {
			n, root := laneNode(t, 8)
			r := attachLane(t, n, root, window, true)
			if b := r.first(t); b != laneAck {
				t.Fatalf("the stream's first message: %+v; want the lane's ack %+v", b, laneAck)
			}
			done := r.run(7, nil)
			waitAttached(t, n.m, 1)
			c := dial(t, n.addr, "", "bytes")
			calls := make([]*Call, 12)
			for i := range calls {
				calls[i] = c.Go(ctxT(t), rowsOf(t, 10*i, 1+i%3))
			}
			for i, call := range calls {
				wantAnswer(t, "a batch through the lane", call, 10*i, 1+i%3, 7)
			}
			for len(r.gotFrame) > 0 {
				f := <-r.gotFrame
				if f[1]%8 != 0 || f[1] >= window*8 {
					t.Fatalf("batch %d at row %d: not a lane's first row (max batch 8, window %d)", f[0], f[1], window)
				}
			}
			r.st.Close() // the replica leaves: the node closes its end of the lane
			select {
			case err := <-done:
				if err != io.EOF {
					t.Fatalf("the lane's end, read by the replica: %v, want EOF", err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the node kept the lane open after the stream ended")
			}
			waitAttached(t, n.m, 0)
		})
	}
}

// laneHolding attaches a lane replica (window 1) to a node of its own
// and has it read the frame of a 3-row request's batch, which it holds:
// the node, the replica, the request and the batch's number.
func laneHolding(t *testing.T) (*node, *laneReplica, *Call, uint64) {
	t.Helper()
	n, root := laneNode(t, 8)
	r := attachLane(t, n, root, 1, true)
	r.first(t)
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	call := c.Go(ctxT(t), rowsOf(t, 5, 3))
	batch, _, _, err := r.readFrame()
	if err != nil {
		t.Fatal(err)
	}
	return n, r, call, batch
}

// TestLane_GoneMidBatch: a replica whose process dies holding a batch
// (its FIFO ends closed, its stream still open as a dying process's may
// be for a moment) is detached at the lane's end, and the batch runs on
// another replica.
func TestLane_GoneMidBatch(t *testing.T) {
	n, r, call, _ := laneHolding(t)
	attachReplica(t, n.addr, 2, nil)
	waitAttached(t, n.m, 2)
	r.closeLane()
	wantAnswer(t, "the batch the dead replica held, run by another", call, 5, 3, 2)
	waitAttached(t, n.m, 1)
}

// TestLane_Failures: an answer with an error fails the batch with
// ErrForward and its message, and detaches the replica; a frame the node
// cannot read detaches it too, the batch running elsewhere.
func TestLane_Failures(t *testing.T) {
	t.Run("an error", func(t *testing.T) {
		n, root := laneNode(t, 8)
		r := attachLane(t, n, root, 1, true)
		r.first(t)
		r.run(1, func(uint64, int) (string, bool) { return "ValueError: boom in forward", false })
		waitAttached(t, n.m, 1)
		c := dial(t, n.addr, "", "bytes")
		_, _, err := c.Predict(ctxT(t), rowsOf(t, 5, 3))
		if !errors.Is(err, ErrForward) || !strings.Contains(err.Error(), "boom in forward") {
			t.Fatalf("a batch the replica failed: %v, want ErrForward with its message", err)
		}
		waitAttached(t, n.m, 0)
	})
	t.Run("a frame out of the protocol", func(t *testing.T) {
		n, r, call, batch := laneHolding(t)
		bad := appendLaneAnswer(nil, replicaAnswer{Batch: batch, Version: 1})
		bad[20] = 1 // the word that must be zero
		attachReplica(t, n.addr, 2, nil)
		waitAttached(t, n.m, 2)
		if _, err := r.answers.Write(bad); err != nil {
			t.Fatal(err)
		}
		wantAnswer(t, "the batch of a replica that broke its lane, run by another", call, 5, 3, 2)
		waitAttached(t, n.m, 1)
	})
}

// TestLane_NotFIFOs: a folder whose lane files are not FIFOs gets no
// lane: the node says nothing of it and sends the batches on the stream,
// as a node from before lanes does.
func TestLane_NotFIFOs(t *testing.T) {
	n, root := laneNode(t, 8)
	r := attachLane(t, n, root, 1, false)
	waitAttached(t, n.m, 1)
	c := dial(t, n.addr, "", "bytes")
	call := c.Go(ctxT(t), rowsOf(t, 5, 3))
	b := r.first(t)
	if b.Batch != 1 || b.N != 3 || b.Row != 0 {
		t.Fatalf("the first message on the stream of a replica without FIFOs: %+v; want batch 1 of 3 rows at row 0", b)
	}
	if err := r.forward(0, 3); err != nil {
		t.Fatal(err)
	}
	if err := r.st.Send(ctxT(t), replicaAnswer{Batch: 1, Version: 4}); err != nil {
		t.Fatal(err)
	}
	wantAnswer(t, "a batch on the stream of a replica whose lane the node did not take", call, 5, 3, 4)
}
