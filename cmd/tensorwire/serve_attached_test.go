package main

import (
	"strings"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// TestParseRowSchema: input= and output= of a --serve model with
// replicas=0 read fields KEY:DTYPE:SHAPE joined by +, or say what is wrong.
func TestParseRowSchema(t *testing.T) {
	ok := []struct {
		in   string
		want tensordict.RowSchema
	}{
		{"obs:float32:64", tensordict.RowSchema{{Key: []string{"obs"}, DType: memmap.Float32, Shape: []int{64}}}},
		{"obs/image:uint8:4x84x84+obs/vec:torch.float32:8+done:bool:", tensordict.RowSchema{
			{Key: []string{"obs", "image"}, DType: memmap.Uint8, Shape: []int{4, 84, 84}},
			{Key: []string{"obs", "vec"}, DType: memmap.Float32, Shape: []int{8}},
			{Key: []string{"done"}, DType: memmap.Bool, Shape: []int{}}}},
	}
	for _, tc := range ok {
		got, err := parseRowSchema(tc.in)
		if err != nil || got.String() != tc.want.String() {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"obs", "want KEY:DTYPE:SHAPE"},
		{":float32:4", "want KEY:DTYPE:SHAPE"},
		{"obs:flaot32:4", "dtype"},
		{"obs:float32:4x0", "dimensions of at least 1"},
		{"obs:float32:four", "dimensions of at least 1"},
		{"obs:float32:4+obs:float32:4", ""},
	} {
		_, err := parseRowSchema(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error about %q", tc.in, err, tc.want)
		}
	}
}
