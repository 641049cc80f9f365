package benchkit

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestPickRows_Distinct(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]int, 5)
	for range 1000 {
		PickRows(rng, 6, rows)
		s := slices.Clone(rows)
		slices.Sort(s)
		if len(slices.Compact(s)) != 5 || s[0] < 0 || s[4] >= 6 {
			t.Fatalf("rows %v are not 5 distinct indices in [0, 6)", rows)
		}
	}
}

func TestBuffers(t *testing.T) {
	if b := Touched(4097); !bytes.Equal(b, bytes.Repeat([]byte{0x5a}, 4097)) {
		t.Error("Touched did not write every byte")
	}
	a, err := Anon(8192)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, bytes.Repeat([]byte{0xa5}, 8192)) {
		t.Error("Anon did not write every byte")
	}
	FlushCache(a)
	if err := Free(a); err != nil {
		t.Fatal(err)
	}
}
