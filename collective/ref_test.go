package collective

// A plain, single-process computation of every collective, on float64
// values with explicit index arithmetic (nothing shared with the package's
// geometry code), to check the ranks' results against.

import (
	"math"
	"slices"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// nd is an n-d array of float64 in C order.
type nd struct {
	shape []int
	v     []float64
}

func toND(t testing.TB, x *tensordict.Tensor) nd {
	t.Helper()
	if x == nil {
		return nd{}
	}
	b, err := x.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	dt, es := x.DType(), x.DType().Size()
	v := make([]float64, x.NumElements())
	for i := range v {
		v[i] = dt.Float64(b[i*es:])
	}
	return nd{x.Shape(), v}
}

// strides of a shape, in elements.
func strides(shape []int) []int {
	s := make([]int, len(shape))
	acc := 1
	for d := len(shape) - 1; d >= 0; d-- {
		s[d] = acc
		acc *= shape[d]
	}
	return s
}

// index returns the multi-index of flat position i.
func index(shape []int, i int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		idx[d] = i % shape[d]
		i /= shape[d]
	}
	return idx
}

func (a nd) at(idx []int) float64 {
	st := strides(a.shape)
	o := 0
	for d, x := range idx {
		o += x * st[d]
	}
	return a.v[o]
}

// concat joins xs along axis.
func concat(xs []nd, axis int) nd {
	shape := slices.Clone(xs[0].shape)
	shape[axis] = 0
	for _, x := range xs {
		shape[axis] += x.shape[axis]
	}
	out := nd{shape, make([]float64, numel(shape))}
	for i := range out.v {
		idx := index(shape, i)
		k := idx[axis]
		for _, x := range xs {
			if k < x.shape[axis] {
				idx[axis] = k
				out.v[i] = x.at(idx)
				break
			}
			k -= x.shape[axis]
		}
	}
	return out
}

// split cuts x along axis into pieces of counts.
func split(x nd, axis int, counts []int) []nd {
	var out []nd
	off := 0
	for _, c := range counts {
		shape := slices.Clone(x.shape)
		shape[axis] = c
		p := nd{shape, make([]float64, numel(shape))}
		for i := range p.v {
			idx := index(shape, i)
			idx[axis] += off
			p.v[i] = x.at(idx)
		}
		out = append(out, p)
		off += c
	}
	return out
}

// reduce folds xs elementwise with op, left to right, as dtype dt would.
func reduce(xs []nd, op Op, dt memmap.DType) nd {
	out := nd{slices.Clone(xs[0].shape), slices.Clone(xs[0].v)}
	for _, x := range xs[1:] {
		for i := range out.v {
			a, b := out.v[i], x.v[i]
			var r float64
			switch op {
			case Sum:
				r = a + b
			case Prod:
				r = a * b
			case Min:
				r = math.Min(a, b)
			case Max:
				r = math.Max(a, b)
			case LAnd:
				r = b2f(a != 0 && b != 0)
			case LOr:
				r = b2f(a != 0 || b != 0)
			case LXor:
				r = b2f((a != 0) != (b != 0))
			case BAnd:
				r = float64(int64(a) & int64(b))
			case BOr:
				r = float64(int64(a) | int64(b))
			case BXor:
				r = float64(int64(a) ^ int64(b))
			}
			out.v[i] = r
		}
		// wrap-around and rounding as dtype dt
		if dt != memmap.Float64 {
			buf := make([]byte, 8)
			for i := range out.v {
				dt.PutFloat64(buf, out.v[i])
				out.v[i] = dt.Float64(buf)
			}
		}
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func zerosND(shape []int) nd { return nd{slices.Clone(shape), make([]float64, numel(shape))} }

func dot(a, b nd) float64 {
	s := 0.0
	for i := range a.v {
		s += a.v[i] * b.v[i]
	}
	return s
}

// close reports whether got matches want to within tol (relative).
func closeND(got, want nd, tol float64) bool {
	if !slices.Equal(got.shape, want.shape) || len(got.v) != len(want.v) {
		return false
	}
	for i := range got.v {
		d := math.Abs(got.v[i] - want.v[i])
		if d > tol*max(1, math.Abs(want.v[i])) && !(math.IsNaN(got.v[i]) && math.IsNaN(want.v[i])) {
			return false
		}
	}
	return true
}
