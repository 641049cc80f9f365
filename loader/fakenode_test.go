package loader

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// fakeNode is a node that answers consumers from a script instead of a
// producer: a join response, the messages of the consumer's stream and
// how the stream ends. Its root holds a real producer's ring, copied, in
// which slots 0 and 1 hold batches 0 and 1, the whole of epoch 0, of an
// 8-sample dataset at 4 rows a batch (seed 7); newRing copies it again
// for a script to point a consumer at.
type fakeNode struct {
	root string
	addr string
	tmpl string                   // the real ring's folder
	join joinResponse             // the real producer's answer to a join of batch 4, Prefix empty
	anns []announcement           // its announcements of batches 0 and 1
	rows []*tensordict.TensorDict // their rows

	mu     sync.Mutex
	script nodeScript
	rings  int
}

// nodeScript is what a fakeNode answers.
type nodeScript struct {
	join    joinResponse
	joinErr error
	msgs    []batchMessage
	end     error // how the stream ends after msgs; nil: the handler returns nil
}

// The real ring's figures.
const (
	fakeSamples = 8
	fakeBatch   = 4
	fakeSlots   = 2
	fakeSeed    = 7
)

func newFakeNode(t testing.TB) *fakeNode {
	t.Helper()
	root := t.TempDir()
	n := &fakeNode{root: root, tmpl: filepath.Join(root, "tmpl")}
	makeDataset(t, filepath.Join(root, "data"), fakeSamples)
	p, err := NewProducer(Config{Dataset: filepath.Join(root, "data"), Dir: filepath.Join(root, "real"),
		Batch: fakeBatch, Slots: fakeSlots, Seed: fakeSeed, Heartbeat: time.Hour, MaxWait: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ji, err := p.join(fakeBatch)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	epoch, index := ji.epoch, 0
	for len(n.anns) < fakeSlots {
		as, err := p.push(ctx, ji.id, &epoch, &index)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range as {
			td, err := p.copyBatch(a, ringBatchBuf(t, p))
			if err != nil {
				t.Fatal(err)
			}
			n.anns, n.rows = append(n.anns, a), append(n.rows, td)
		}
	}
	if err := os.CopyFS(n.tmpl, os.DirFS(p.ring.path)); err != nil {
		t.Fatal(err)
	}
	n.join = joinResponse{Ring: p.ring.id, Consumer: ji.id, Epoch: ji.epoch, Schema: p.Schema(), Samples: p.Len(),
		Batch: fakeBatch, Slots: fakeSlots, HeartbeatMS: time.Hour.Milliseconds()}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}

	srv, err := rpc.NewServer(rpc.WithRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	regs := []error{
		rpc.Register(srv, MethodJoin, func(context.Context, joinRequest) (joinResponse, error) {
			s := n.current()
			return s.join, s.joinErr
		}),
		rpc.RegisterStream(srv, MethodConsume, func(ctx context.Context, _ consumeRequest, st *rpc.ServerStream[ackMessage, batchMessage]) error {
			s := n.current()
			go func() {
				for {
					if _, err := st.Recv(ctx); err != nil {
						return
					}
				}
			}()
			for _, m := range s.msgs {
				if m.Rows != nil {
					// A TD of its own per Send: rpc keeps what it sends of a
					// TD in it, and a consumer's next session may be sent
					// the same messages while this stream still sends.
					m.Rows = &rpc.TD{TensorDict: m.Rows.TensorDict, Rows: m.Rows.Rows}
				}
				if err := st.Send(ctx, m); err != nil {
					return err
				}
			}
			return s.end
		}),
		rpc.Register(srv, MethodLeave, func(context.Context, leaveRequest) (rpc.Empty, error) { return rpc.Empty{}, nil }),
	}
	for _, err := range regs {
		if err != nil {
			t.Fatal(err)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n.addr = l.Addr().String()
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return n
}

func (n *fakeNode) current() nodeScript {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.script
}

func (n *fakeNode) play(s nodeScript) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.script = s
}

// newRing copies the real ring to a folder of its own under the root and
// returns its prefix (relative to the root) and its path; the copy is
// removed when t ends.
func (n *fakeNode) newRing(t testing.TB) (string, string) {
	t.Helper()
	n.mu.Lock()
	n.rings++
	prefix := "it/" + strconv.Itoa(n.rings)
	n.mu.Unlock()
	path := filepath.Join(n.root, filepath.FromSlash(prefix))
	if err := os.CopyFS(path, os.DirFS(n.tmpl)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(path) })
	return prefix, path
}

// honest returns the script of an honest node for a consumer whose ring is
// at prefix: the real join response, and the epoch's two batches, with
// their rows when bytes.
func (n *fakeNode) honest(prefix string, bytes bool) nodeScript {
	s := nodeScript{join: n.join}
	s.join.Prefix = prefix
	for i, a := range n.anns {
		m := batchMessage{Batch: a}
		if bytes {
			m.Rows = &rpc.TD{TensorDict: n.rows[i]}
		}
		s.msgs = append(s.msgs, m)
	}
	return s
}

// rowsVariant returns rows for a message announcing a: kind 0 the
// announced slot's rows (its first a.Rows, when that many are there),
// 1 none, 2 slot 0's four rows whatever a says, 3 only the labels, 4 the
// labels as int32, 5 an extra field.
func (n *fakeNode) rowsVariant(t testing.TB, kind int64, a announcement) *rpc.TD {
	t.Helper()
	k := max(0, min(a.Rows, fakeBatch))
	src := n.rows[0]
	if a.Slot == 1 {
		src = n.rows[1]
	}
	part, err := src.Slice(0, k)
	if err != nil {
		t.Fatal(err)
	}
	switch kind {
	case 1:
		return nil
	case 2:
		return &rpc.TD{TensorDict: src}
	case 3, 4, 5:
		td, err := tensordict.New(k)
		if err != nil {
			t.Fatal(err)
		}
		lbl := make([]int64, k)
		if kind == 4 {
			x, _ := tensordict.FromSlice(make([]int32, k), k)
			td.Set("labels", x)
		} else {
			x, _ := tensordict.FromSlice(lbl, k)
			td.Set("labels", x)
		}
		if kind == 5 {
			img, _ := part.Get("images")
			td.Set("images", img)
			x, _ := tensordict.FromSlice(make([]uint8, k), k)
			td.Set("x", x)
		}
		return &rpc.TD{TensorDict: td}
	}
	return &rpc.TD{TensorDict: part}
}

// schemaVariant returns a schema for a join response: kind 0 the real
// one, 1 only its images, 2 its images as float32, 3 with an extra
// field, 4 none, 5 images of a terabyte a row.
func (n *fakeNode) schemaVariant(kind int64) tensordict.RowSchema {
	s := n.join.Schema.Clone()
	switch kind {
	case 1:
		return s[:1]
	case 2:
		s[0].DType = memmap.Float32
	case 3:
		s = append(s, tensordict.RowField{Key: []string{"x"}, DType: memmap.Uint8})
	case 4:
		return nil
	case 5:
		s[0].Shape = []int{1 << 20, 1 << 20}
	}
	return s
}

// fuzzInts reads signed varints from a fuzzer's bytes; once they run out,
// or are not a varint, each read gives its default.
type fuzzInts []byte

func (r *fuzzInts) next(def int64) int64 {
	v, n := binary.Varint(*r)
	if n <= 0 {
		*r = nil
		return def
	}
	*r = (*r)[n:]
	return v
}

// varints encodes vs as fuzzInts reads them.
func varints(vs ...int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.AppendVarint(b, v)
	}
	return b
}

// String is for test failures.
func (s nodeScript) String() string {
	out := fmt.Sprintf("join %+v (err %v)", s.join, s.joinErr)
	for _, m := range s.msgs {
		rows := -1
		if m.Rows != nil && m.Rows.TensorDict != nil {
			rows = m.Rows.Len()
		}
		out += fmt.Sprintf("; %+v with %d rows", m.Batch, rows)
	}
	return out + fmt.Sprintf("; end %v", s.end)
}
