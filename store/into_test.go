package store

import (
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/tensordict"
)

// weightsTD is a parameter set of one int64 tensor "x" of n values v.
func weightsTD(t *testing.T, n int, v int64) *tensordict.TensorDict {
	t.Helper()
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	x, err := tensordict.FromSlice(slices.Repeat([]int64{v}, n))
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Set("x", x); err != nil {
		t.Fatal(err)
	}
	return td
}

// valuesOf returns td's "x".
func valuesOf(t *testing.T, td *tensordict.TensorDict) []int64 {
	t.Helper()
	x, err := td.Tensor("x")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := tensordict.Values[int64](x)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// TestClient_LatestInto: by bytes, LatestInto and WaitNewerInto read the
// version into the buffer given when its layout is the buffer's, and into
// new memory when not (the buffer untouched); by reference the Param maps
// the version and the buffer is not written.
func TestClient_LatestInto(t *testing.T) {
	const n = 1 << 16 // 512 KiB: over InlineBytes, a prefix of its own
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			ctx := ctxT(t)
			root := t.TempDir()
			srv := serveStore(t, root, "st", Options{InlineBytes: 512})
			c := dialT(t, srv.addr, "st", root, mode)
			if _, err := c.Publish(ctx, "w", weightsTD(t, n, 1)); err != nil {
				t.Fatal(err)
			}
			buf := weightsTD(t, n, 0)
			other := weightsTD(t, n-1, 0) // another shape
			p, err := c.LatestInto(ctx, "w", buf)
			if err != nil {
				t.Fatal(err)
			}
			if got := p.TD == buf; got != (mode == "bytes") {
				t.Errorf("the Param's TD is the buffer: %v, in mode %s", got, mode)
			}
			if vs := valuesOf(t, p.TD); vs[0] != 1 || vs[n-1] != 1 {
				t.Errorf("version 1 reads %d...%d", vs[0], vs[n-1])
			}
			p.Close()
			if mode == "ref" && valuesOf(t, buf)[0] != 0 {
				t.Error("by reference the buffer was written")
			}

			if _, err := c.Publish(ctx, "w", weightsTD(t, n, 2)); err != nil {
				t.Fatal(err)
			}
			p, err = c.WaitNewerInto(ctx, "w", 1, buf)
			if err != nil {
				t.Fatal(err)
			}
			if p.Version != 2 || (p.TD == buf) != (mode == "bytes") || valuesOf(t, p.TD)[n-1] != 2 {
				t.Errorf("WaitNewerInto: version %d, into the buffer %v, values %d", p.Version, p.TD == buf, valuesOf(t, p.TD)[n-1])
			}
			p.Close()

			p, err = c.LatestInto(ctx, "w", other)
			if err != nil {
				t.Fatal(err)
			}
			if p.TD == other || valuesOf(t, p.TD)[0] != 2 || valuesOf(t, other)[0] != 0 {
				t.Errorf("a buffer of another shape: the Param's TD is it %v, reads %d, the buffer holds %d", p.TD == other, valuesOf(t, p.TD)[0], valuesOf(t, other)[0])
			}
			p.Close()
		})
	}
}
