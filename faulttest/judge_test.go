package faulttest

import "testing"

// The checker must catch what it is there to catch.
func TestJudge(t *testing.T) {
	log := func() *batchLog {
		l := &batchLog{begun: map[int64]int{}, acked: map[int64]bool{}}
		for _, first := range []int64{transitionID(0, 0, 0), transitionID(0, 0, 2), transitionID(1, 3, 0)} {
			l.begun[first] = 2
		}
		l.acked[transitionID(0, 0, 0)] = true
		l.acked[transitionID(1, 3, 0)] = true
		return l
	}
	a0, a1 := transitionID(0, 0, 0), transitionID(0, 0, 1)
	u0, u1 := transitionID(0, 0, 2), transitionID(0, 0, 3)
	b0, b1 := transitionID(1, 3, 0), transitionID(1, 3, 1)
	for _, tc := range []struct {
		name string
		held []int64
		want verdict
		ok   bool
	}{
		{"exactly the acked", []int64{a0, a1, b0, b1}, verdict{Acked: 4, Held: 4}, true},
		{"and a whole batch in flight", []int64{a0, a1, u0, b0, u1, b1}, verdict{Acked: 4, Held: 6, InFlight: 1}, true},
		{"an acked one lost", []int64{a0, b0, b1}, verdict{Acked: 4, Held: 3, Lost: 1}, false},
		{"a duplicate", []int64{a0, a1, a1, b0, b1}, verdict{Acked: 4, Held: 5, Duplicated: 1}, false},
		{"half a batch in flight", []int64{a0, a1, u1, b0, b1}, verdict{Acked: 4, Held: 5, Partial: 1}, false},
		{"one nobody wrote", []int64{a0, a1, b0, b1, transitionID(2, 0, 0)}, verdict{Acked: 4, Held: 5, Unknown: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := judge(log(), tc.held)
			if got != tc.want || got.ok() != tc.ok {
				t.Fatalf("judge = %+v (ok %v), want %+v (ok %v)", got, got.ok(), tc.want, tc.ok)
			}
		})
	}
}

func TestTornRows(t *testing.T) {
	td := transitions(transitionID(0, 1, 0), 4)
	if n, err := tornRows(td); err != nil || n != 0 {
		t.Fatalf("whole rows: %d torn, %v", n, err)
	}
	obs, _ := td.Tensor("obs")
	b, _ := obs.Bytes()
	b[2*obsWidth*8+5] ^= 1 // one byte of row 2
	if n, err := tornRows(td); err != nil || n != 1 {
		t.Fatalf("one row changed: %d torn, %v", n, err)
	}
}
