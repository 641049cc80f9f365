package rowcopy

import (
	"bytes"
	"testing"
)

func TestGatherScatterFill(t *testing.T) {
	src := []byte{1, 1, 2, 2, 3, 3}
	dst := make([]byte, 6)
	Gather(dst, src, 2, []int{2, 0, 2})
	if !bytes.Equal(dst, []byte{3, 3, 1, 1, 3, 3}) {
		t.Errorf("Gather = %v", dst)
	}
	out := make([]byte, 6)
	Scatter(out, []byte{7, 7, 8, 8}, 2, []int{1, 1})
	if !bytes.Equal(out, []byte{0, 0, 8, 8, 0, 0}) {
		t.Errorf("Scatter with a repeated row = %v, want the last copy", out)
	}
	big := make([]byte, 3*10)
	Fill(big, 10, []int{2, 0}, []byte{5, 6})
	want := append(append(bytes.Repeat([]byte{5, 6}, 5), make([]byte, 10)...), bytes.Repeat([]byte{5, 6}, 5)...)
	if !bytes.Equal(big, want) {
		t.Errorf("Fill = %v, want %v", big, want)
	}
	Fill(big, 10, nil, []byte{9, 9}) // no rows: nothing
	if !bytes.Equal(big, want) {
		t.Error("Fill of no rows wrote")
	}
}
