package store

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// obsTD returns a TensorDict with n bytes of observations, each i+j.
func obsTD(t testing.TB, i, n int) (*tensordict.TensorDict, []byte) {
	t.Helper()
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*7 + j)
	}
	x, err := tensordict.FromBytes(memmap.Uint8, []int{n}, b)
	if err != nil {
		t.Fatal(err)
	}
	td, err := tensordict.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := td.Set("obs", x); err != nil {
		t.Fatal(err)
	}
	if err := td.Set("i", &tensordict.NonTensor{Data: i}); err != nil {
		t.Fatal(err)
	}
	return td, b
}

// TestAliasInline_FindsTheValueInItsFrame: a record's inline value is
// found in its prepared frame, for each msgpack bin size class, and the
// bytes found are the value's.
func TestAliasInline_FindsTheValueInItsFrame(t *testing.T) {
	for _, n := range []int{1, 100, 300, 28 << 10, 70000} {
		td, _ := obsTD(t, n, n)
		v, err := encodeValue(td)
		if err != nil {
			t.Fatal(err)
		}
		p, err := prepare(&record{Op: recAppend, Name: "b", Items: []recItem{{ID: 1, Size: int64(n), Inline: v}}})
		if err != nil {
			t.Fatal(err)
		}
		a, _ := aliasInline(p.frame, v, 0)
		if a == nil {
			t.Errorf("%d bytes: not found in the frame", n)
			continue
		}
		if !bytes.Equal(a, v) || &a[0] == &v[0] {
			t.Errorf("%d bytes: found bytes that are not the value's, or the value itself", n)
		}
	}
	if a, _ := aliasInline([]byte("too short"), make([]byte, 100), 0); a != nil {
		t.Error("found a value in a frame too short to hold it")
	}
}

// TestAliasInline_ManyValuesInOrder: the values of a record of several
// (an Extend's) are each found at their own place, in order, searching on
// from where the one before ended; equal values too.
func TestAliasInline_ManyValuesInOrder(t *testing.T) {
	var items []recItem
	var vals [][]byte
	for k, i := range []int{1, 2, 1, 3, 3} { // equal values, and different ones
		td, _ := obsTD(t, i, 300)
		v, err := encodeValue(td)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, recItem{ID: uint64(k + 1), Size: 300, Inline: v})
		vals = append(vals, v)
	}
	p, err := prepare(&record{Op: recAppend, Name: "b", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	from, last := 0, -1
	for k, v := range vals {
		var a []byte
		if a, from = aliasInline(p.frame, v, from); a == nil || !bytes.Equal(a, v) {
			t.Fatalf("value %d: not found after offset %d", k, last)
		}
		at := int(uintptr(unsafe.Pointer(&a[0])) - uintptr(unsafe.Pointer(&p.frame[0])))
		if at <= last {
			t.Errorf("value %d at offset %d, not after the one before (%d)", k, at, last)
		}
		last = at
	}
}

// TestStore_AppendsKeepTheirBytes: values kept in their log frames, their
// encoding buffers reused by the next appends, each item still reads as
// it was appended, before and after a reopen.
func TestStore_AppendsKeepTheirBytes(t *testing.T) {
	ctx := ctxT(t)
	dir := t.TempDir()
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const items, n = 60, 28 << 10
	want := make([][]byte, items)
	for i := range items {
		td, b := obsTD(t, i, n)
		want[i] = b
		if _, err := s.Append(ctx, "b", td); err != nil {
			t.Fatal(err)
		}
	}
	check := func(s *Store, when string) {
		got, err := s.Peek(ctx, "b")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != items {
			t.Fatalf("%s: %d items, want %d", when, len(got), items)
		}
		for i, td := range got {
			x, err := td.Tensor("obs")
			if err != nil {
				t.Fatal(err)
			}
			b, err := x.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, want[i]) {
				t.Fatalf("%s: item %d's bytes changed after later appends", when, i)
			}
		}
	}
	check(s, "running")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openT(t, dir, Options{})
	check(s, "reopened")
}
