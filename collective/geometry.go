package collective

import "slices"

// Geometry of the axis operations. A tensor is C-order bytes of a shape; a
// box is a sub-array: an offset and an extent in each dimension. Pieces of
// a tensor along an axis, the blocks Gather and Scatter move, are boxes.

// numel returns the number of elements of shape.
func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// boxRuns calls fn once per contiguous run of a box of extent box placed at
// offs[i] in tensors of shapes shapes[i] (all of rank len(box)) with
// elements of esize bytes: with the byte offset of the run in each tensor
// and the run's length in bytes. Runs come in C order of the box.
func boxRuns(shapes [][]int, offs [][]int, box []int, esize int, fn func(at []int, n int)) {
	nd := len(box)
	if numel(box) == 0 {
		return
	}
	// k: the outermost dim of the run; every dim after it is whole in
	// every tensor, so the run is box[k] * (the rest) elements.
	k := nd - 1
	for k > 0 {
		whole := true
		for i := range shapes {
			if shapes[i][k] != box[k] {
				whole = false
				break
			}
		}
		if !whole {
			break
		}
		k--
	}
	if nd == 0 {
		at := make([]int, len(shapes))
		fn(at, esize)
		return
	}
	run := esize
	for d := k; d < nd; d++ {
		run *= box[d]
	}
	// strides[i][d]: bytes between consecutive indices of dim d in tensor i.
	strides := make([][]int, len(shapes))
	for i, s := range shapes {
		st := make([]int, nd)
		acc := esize
		for d := nd - 1; d >= 0; d-- {
			st[d] = acc
			acc *= s[d]
		}
		strides[i] = st
	}
	idx := make([]int, k) // odometer over dims < k
	at := make([]int, len(shapes))
	for {
		for i := range shapes {
			o := 0
			for d := 0; d < nd; d++ {
				x := offs[i][d]
				if d < k {
					x += idx[d]
				}
				o += x * strides[i][d]
			}
			at[i] = o
		}
		fn(at, run)
		d := k - 1
		for ; d >= 0; d-- {
			idx[d]++
			if idx[d] < box[d] {
				break
			}
			idx[d] = 0
		}
		if d < 0 {
			return
		}
	}
}

// boxCopy copies the box of extent box at soff in src (shape sshape) to
// doff in dst (shape dshape).
func boxCopy(dst []byte, dshape, doff []int, src []byte, sshape, soff []int, box []int, esize int) {
	boxRuns([][]int{dshape, sshape}, [][]int{doff, soff}, box, esize, func(at []int, n int) {
		copy(dst[at[0]:at[0]+n], src[at[1]:at[1]+n])
	})
}

// zeros returns a slice of n zeros (offsets of a box's corner).
func zeros(n int) []int { return make([]int, n) }

// along returns shape with dimension axis set to n.
func along(shape []int, axis, n int) []int {
	s := slices.Clone(shape)
	s[axis] = n
	return s
}

// at returns a zero offset but for off in dimension axis.
func at(nd, axis, off int) []int {
	o := make([]int, nd)
	o[axis] = off
	return o
}

// prefix returns the running sums of counts: prefix[i] is the sum of
// counts[:i].
func prefix(counts []int) []int {
	p := make([]int, len(counts)+1)
	for i, c := range counts {
		p[i+1] = p[i] + c
	}
	return p
}

// evenCounts splits n into k counts differing by at most one, the larger
// first.
func evenCounts(n, k int) []int {
	c := make([]int, k)
	for i := range c {
		c[i] = n / k
		if i < n%k {
			c[i]++
		}
	}
	return c
}
