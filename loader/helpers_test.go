package loader

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/rpc"
	"github.com/tensorwire/tensorwire/tensordict"
)

// testRow is the row shape of the test datasets' "images".
var testRow = []int{2, 4, 4}

// makeDataset writes a dataset of n samples at prefix: "images" uint8
// [n, 2, 4, 4], sample i's first 8 bytes i (little-endian) and the others
// byte(7i+3); "labels" int64 [n], i.
func makeDataset(t testing.TB, prefix string, n int) {
	t.Helper()
	makeDatasetOf(t, prefix, n, testRow)
}

// makeDatasetOf is makeDataset with images of the given row shape (at
// least 8 bytes).
func makeDatasetOf(t testing.TB, prefix string, n int, row []int) {
	t.Helper()
	td, err := tensordict.Create(prefix, []int{n},
		tensordict.Field{Key: []string{"images"}, DType: memmap.Uint8, Shape: append([]int{n}, row...)},
		tensordict.Field{Key: []string{"labels"}, DType: memmap.Int64, Shape: []int{n}})
	if err != nil {
		t.Fatal(err)
	}
	defer td.Close()
	img, _ := td.Tensor("images")
	lbl, _ := td.Tensor("labels")
	ib, _ := img.Bytes()
	lb, _ := lbl.Bytes()
	rb := img.RowBytes()
	for i := range n {
		row := ib[i*rb : (i+1)*rb]
		for j := range row {
			row[j] = byte(7*i + 3)
		}
		binary.LittleEndian.PutUint64(row, uint64(i))
		binary.LittleEndian.PutUint64(lb[8*i:], uint64(i))
	}
	if err := td.Flush(); err != nil {
		t.Fatal(err)
	}
}

// sampleIDs returns the sample each row of a batch holds, checking that
// its image and label agree with it (and its index, when the batch has
// one).
func sampleIDs(batch *tensordict.TensorDict) ([]int, error) {
	img, err := batch.Tensor("images")
	if err != nil {
		return nil, err
	}
	lbl, err := tensordict.Values[int64](mustTensor(batch, "labels"))
	if err != nil {
		return nil, err
	}
	ib, err := img.Bytes()
	if err != nil {
		return nil, err
	}
	var index []int64
	if _, err := batch.Get("index"); err == nil {
		if index, err = tensordict.Values[int64](mustTensor(batch, "index")); err != nil {
			return nil, err
		}
	}
	rb := img.RowBytes()
	ids := make([]int, batch.Len())
	for r := range ids {
		row := ib[r*rb : (r+1)*rb]
		id := int(binary.LittleEndian.Uint64(row))
		for j, b := range row[8:] {
			if b != byte(7*id+3) {
				return nil, fmt.Errorf("row %d (sample %d): byte %d is %d, want %d", r, id, 8+j, b, byte(7*id+3))
			}
		}
		if int(lbl[r]) != id {
			return nil, fmt.Errorf("row %d: label %d, image of sample %d", r, lbl[r], id)
		}
		if index != nil && int(index[r]) != id {
			return nil, fmt.Errorf("row %d: index %d, image of sample %d", r, index[r], id)
		}
		ids[r] = id
	}
	return ids, nil
}

func mustTensor(td *tensordict.TensorDict, key string) *tensordict.Tensor {
	t, err := td.Tensor(key)
	if err != nil {
		panic(err)
	}
	return t
}

// fixture is a dataset, a producer of it and a node serving it.
type fixture struct {
	root    string
	dataset string
	p       *Producer
	srv     *rpc.Server
	addr    string
}

// newFixture makes a dataset of n samples under a new root, a producer of
// cfg (Dataset and Dir filled in when empty) and serves it as "train".
func newFixture(t testing.TB, n int, cfg Config) *fixture {
	t.Helper()
	return newFixtureOf(t, n, testRow, cfg)
}

// newFixtureOf is newFixture with images of the given row shape.
func newFixtureOf(t testing.TB, n int, row []int, cfg Config) *fixture {
	t.Helper()
	root := t.TempDir()
	f := &fixture{root: root, dataset: filepath.Join(root, "data")}
	makeDatasetOf(t, f.dataset, n, row)
	if cfg.Dataset == "" {
		cfg.Dataset = f.dataset
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(root, "train")
	}
	p, err := NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.p = p
	f.serve(t)
	t.Cleanup(func() {
		f.srv.Close()
		if err := p.Close(); err != nil {
			t.Errorf("Producer.Close: %v", err)
		}
	})
	return f
}

func (f *fixture) serve(t testing.TB) {
	t.Helper()
	srv, err := rpc.NewServer(rpc.WithRoot(f.root))
	if err != nil {
		t.Fatal(err)
	}
	svc, err := Register(srv)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Add("train", f.p); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.srv, f.addr = srv, l.Addr().String()
	go srv.Serve(l)
}

// dial joins the fixture's producer; bytes makes it a consumer without the
// shared filesystem.
func (f *fixture) dial(t testing.TB, batch int, bytes bool) *Consumer {
	t.Helper()
	opts := Options{Batch: batch, Root: f.root}
	if bytes {
		opts.Root = ""
	}
	c, err := Dial(context.Background(), f.addr, "train", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if c.SharedFS() == bytes {
		t.Fatalf("SharedFS = %v for a consumer with bytes=%v", c.SharedFS(), bytes)
	}
	return c
}

// epochIDs iterates one epoch of it and returns the samples in order and
// each batch's size.
func epochIDs(ctx context.Context, batches func(context.Context) iter.Seq2[*tensordict.TensorDict, error]) ([]int, []int, error) {
	var ids, sizes []int
	for b, err := range batches(ctx) {
		if err != nil {
			return ids, sizes, err
		}
		got, err := sampleIDs(b)
		if err != nil {
			return ids, sizes, err
		}
		ids = append(ids, got...)
		sizes = append(sizes, b.Len())
	}
	return ids, sizes, nil
}

// consumerEpoch is epochIDs for a Consumer.
func consumerEpoch(ctx context.Context, c *Consumer) ([]int, []int, error) {
	return epochIDs(ctx, c.Batches)
}

// wantOrder returns the samples of an epoch in the producer's order.
func wantOrder(n int, seed uint64, epoch int64) []int { return order(n, seed, epoch, true) }

// checkEpoch checks ids is epoch's order of n samples, cut into batches of
// size b (sizes).
func checkEpoch(ids, sizes []int, n int, seed uint64, epoch int64, b int) error {
	if want := wantOrder(n, seed, epoch); !slices.Equal(ids, want) {
		return fmt.Errorf("epoch %d: got %d samples %v..., want %d in the producer's order %v...",
			epoch, len(ids), ids[:min(8, len(ids))], len(want), want[:min(8, len(want))])
	}
	for i, s := range sizes {
		if s != b && !(i == len(sizes)-1 && s == n-b*(len(sizes)-1)) {
			return fmt.Errorf("epoch %d: batch %d of %d rows (batch size %d)", epoch, i, s, b)
		}
	}
	if len(sizes) != (n+b-1)/b {
		return fmt.Errorf("epoch %d: %d batches, want %d", epoch, len(sizes), (n+b-1)/b)
	}
	return nil
}

// waitFor polls cond every few milliseconds for up to a minute.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

var _ = errors.Is

// ringBatchBuf returns a new buffer for a batch of p's ring (copyBatch's).
func ringBatchBuf(t testing.TB, p *Producer) *tensordict.TensorDict {
	t.Helper()
	buf, err := p.schema.Zeros(p.ring.batch)
	if err != nil {
		t.Fatal(err)
	}
	return buf
}
