package store

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// placedTD returns a value of n float32 weights under "w" and a nested
// "b"/"bias" of 16, patterned by seed.
func placedTD(t *testing.T, n int, seed byte) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		key []string
		n   int
	}{{[]string{"w"}, n}, {[]string{"b", "bias"}, 16}} {
		x, err := tensordict.Zeros(memmap.Float32, f.n)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := x.Bytes()
		for i := range b {
			b[i] = byte(i*7) + seed
		}
		if err := td.SetPath(f.key, x); err != nil {
			t.Fatal(err)
		}
	}
	return td
}

// TestClient_BytesPlaced: a value sent as bytes that the store keeps as a
// prefix (a published version; a put of InlineBytes or more, alone or in
// an Extend) is written into the node's staging folder as it arrives and
// taken from there (ingestPlaced), and reads back equal, after a reopen
// too; one kept inline, or with non-tensor data, is not placed and reads
// back equal too. A value over MaxValueBytes is refused as ErrTooLarge
// before its bytes are read. Nothing is left in staging/.
func TestClient_BytesPlaced(t *testing.T) {
	var mu sync.Mutex
	var placed []string
	testIngestPlaced = func(dir string) {
		mu.Lock()
		placed = append(placed, dir)
		mu.Unlock()
	}
	t.Cleanup(func() { testIngestPlaced = nil })
	took := func() int {
		mu.Lock()
		defer mu.Unlock()
		n := len(placed)
		placed = nil
		return n
	}
	ctx := ctxT(t)
	root := t.TempDir()
	n := serveStore(t, root, "st", Options{InlineBytes: 64 << 10, MaxValueBytes: 4 << 20})
	c := dialT(t, n.addr, "st", root, "bytes")

	big := placedTD(t, 600_000, 1) // 2.4 MB: three chunks
	withData := placedTD(t, 30_000, 2)
	if err := withData.Set("note", &tensordict.NonTensor{Data: "v2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(ctx, "p", big); err != nil {
		t.Fatal(err)
	}
	if got := took(); got != 1 {
		t.Fatalf("a 2.4 MB version: %d placed values taken, want 1", got)
	}
	p, err := c.Latest(ctx, "p")
	if err != nil || !p.TD.Equal(big) {
		t.Fatalf("Latest = %v, %v; want the version published", p, err)
	}
	p.Close()
	if _, err := c.Publish(ctx, "p", withData); err != nil {
		t.Fatal(err)
	}
	if got := took(); got != 0 {
		t.Fatalf("a version with non-tensor data: %d placed values taken, want 0", got)
	}
	small := placedTD(t, 1000, 3)
	for bin, v := range map[string]*tensordict.TensorDict{"big": big, "small": small} {
		if _, err := c.Put(ctx, bin, v); err != nil {
			t.Fatal(err)
		}
	}
	if got := took(); got != 1 {
		t.Fatalf("two puts, one over InlineBytes: %d placed values taken, want 1", got)
	}
	// An Extend places each value a put would: two of these three.
	ext := []*tensordict.TensorDict{placedTD(t, 100_000, 7), placedTD(t, 100, 8), placedTD(t, 200_000, 9)}
	if _, err := c.Extend(ctx, "ext", ext); err != nil {
		t.Fatal(err)
	}
	if got := took(); got != 2 {
		t.Fatalf("an Extend of two large values and a small one: %d placed values taken, want 2", got)
	}
	if _, err := c.Publish(ctx, "p", placedTD(t, 1_100_000, 4)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a 4.4 MB version with MaxValueBytes 4 MiB: %v, want ErrTooLarge", err)
	}
	check := func(s *Store, bins bool) {
		t.Helper()
		for bin, want := range map[string][]*tensordict.TensorDict{"big": {big}, "small": {small}, "ext": ext} {
			if !bins {
				break // Get takes them
			}
			got, err := s.Get(ctx, bin)
			if err != nil || len(got) != len(want) {
				t.Fatalf("Get(%q) = %v, %v; want the %d values put", bin, got, err, len(want))
			}
			for i, g := range got {
				if !g.Equal(want[i]) {
					t.Fatalf("Get(%q)[%d] = %v, want %v", bin, i, g, want[i])
				}
				g.Close()
			}
		}
		p, err := s.Latest(ctx, "p")
		if err != nil || p.Version != 2 || !p.TD.Equal(withData) {
			t.Fatalf("Latest = %+v, %v; want version 2", p, err)
		}
		p.Close()
		if ents, _ := os.ReadDir(filepath.Join(s.Dir(), stagingDir)); len(ents) != 0 {
			t.Fatalf("staging/ holds %v", ents)
		}
	}
	check(n.s, false)
	n.srv.Close()
	dir := n.s.Dir()
	if err := n.s.Close(); err != nil {
		t.Fatal(err)
	}
	check(openT(t, dir, Options{}), true)
}

// TestOpen_SweepsPlacedLeftovers: a value the node was writing into its
// staging folder when it died (a body cut off midway: files laid out,
// partly filled, no record) is removed when the store is opened again,
// and the values it had logged are there.
func TestOpen_SweepsPlacedLeftovers(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := placedTD(t, 300_000, 6)
	if _, err := s.Publish(ctx, "p", want); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// What a node killed mid-body leaves: CreateUnsynced's layout, part
	// of one megabyte written.
	left := filepath.Join(dir, stagingDir, "n-0000000000000009")
	td, err := tensordict.CreateUnsynced(left, nil, tensordict.Field{Key: []string{"w"}, DType: memmap.Float32, Shape: []int{1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	x, _ := td.Tensor("w")
	x.WriteAt(make([]byte, 4096), 0)
	td.Close()
	s = openT(t, dir, Options{})
	if _, err := os.Lstat(left); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after Open: %v, want it gone", left, err)
	}
	p, err := s.Latest(ctx, "p")
	if err != nil || !p.TD.Equal(want) {
		t.Fatalf("Latest = %v, %v", p, err)
	}
	p.Close()
}
