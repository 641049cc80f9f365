package collective

import (
	"reflect"
	"testing"
)

// FuzzDecodeDesc: a rank's description of its call, read from another
// rank's shared segment or message, is any bytes here. decodeDesc returns
// an error or a desc that encodes back to one equal to it; it never panics
// or allocates past what the bytes can hold.
func FuzzDecodeDesc(f *testing.F) {
	for _, d := range []desc{
		{},
		{kind: 1, op: 2, dtype: 3, hasT: true, root: 1, axis: -1, shape: []int{4, 5}},
		{counts: []int{1, 2, 3}, hasOut: true, out: []int{6}, bad: "mismatch"},
		{counts: []int{}, shape: []int{}},
	} {
		f.Add(d.encode(nil))
	}
	f.Add([]byte{})
	f.Add(make([]byte, 19))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := decodeDesc(b)
		if err != nil {
			return
		}
		if len(d.shape)*8 > len(b) || len(d.counts)*8 > len(b) || len(d.out)*8 > len(b) {
			t.Fatalf("decoded %d, %d and %d dimensions from %d bytes", len(d.shape), len(d.counts), len(d.out), len(b))
		}
		if len(d.bad) > 1024 {
			d.bad = d.bad[:1024] // encode keeps the first KiB of a reason
		}
		again, err := decodeDesc(d.encode(nil))
		if err != nil {
			t.Fatalf("a decoded desc does not decode after encoding: %v", err)
		}
		if !reflect.DeepEqual(d, again) {
			t.Fatalf("round trip changed the desc:\n%+v\n%+v", d, again)
		}
	})
}
