package store

import "testing"

// TestRecordKinds_Table: each op once, the ones the log has always held
// unchanged, and the events' Ops keep their numbers and names (the
// protocol's).
func TestRecordKinds_Table(t *testing.T) {
	want := []struct {
		op    uint8
		event Op
		name  string
	}{{1, 0, ""}, {2, 1, "put"}, {3, 2, "append"}, {4, 3, "get"}, {5, 4, "delete"}, {6, 5, "publish"}}
	ops := map[uint8]bool{}
	for _, k := range recordKinds {
		if ops[k.op] || k.op == 0 || k.apply == nil {
			t.Errorf("op %d: twice, 0 or without apply", k.op)
		}
		ops[k.op] = true
	}
	for _, w := range want {
		k := recordKindOf(w.op)
		if k == nil || k.event != w.event || k.name != w.name {
			t.Errorf("op %d: %+v; want event %d %q", w.op, k, w.event, w.name)
			continue
		}
		if w.event != 0 && w.event.String() != w.name {
			t.Errorf("Op(%d).String() = %q, want %q", w.event, w.event.String(), w.name)
		}
	}
	if s := Op(0).String(); s != "Op(0)" {
		t.Errorf("Op(0).String() = %q", s)
	}
	if s := Op(9).String(); s != "Op(9)" {
		t.Errorf("Op(9).String() = %q", s)
	}
}

// TestAsUint_TwoToThe64: a version decoded as float64 (inline values,
// rpc) of 2^64 does not fit a uint64 and is refused; before the fix it
// passed `v <= math.MaxUint64` (2^64 as a float64) and became
// 0x8000000000000000 on amd64, a version nobody published.
func TestAsUint_TwoToThe64(t *testing.T) {
	if u, ok := asUint(float64(1 << 63 * 2.0)); ok {
		t.Fatalf("asUint(2^64) = %d, true; want false", u)
	}
}
