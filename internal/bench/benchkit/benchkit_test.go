package benchkit

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
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

func TestCheckRow(t *testing.T) {
	for _, tc := range []struct {
		row  []byte
		want byte
		ok   bool
	}{
		{[]byte{7, 7, 7}, 7, true},
		{[]byte{}, 7, true},
		{[]byte{7, 6, 7}, 7, false},
		{[]byte{0, 0, 1}, 0, false},
	} {
		err := CheckRow(3, tc.row, tc.want)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMismatch)) {
			t.Errorf("CheckRow(%v, %d) = %v", tc.row, tc.want, err)
		}
	}
	if err := CheckRow(3, []byte{7, 6}, 7); err == nil || !strings.Contains(err.Error(), "row 3 byte 1 is 6, want 7") {
		t.Errorf("error %v does not name the first differing byte", err)
	}
}
