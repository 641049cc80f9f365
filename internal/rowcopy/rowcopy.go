// Package rowcopy holds the byte loops that move rows of a C-order array:
// one copy per row, shared by mapped storage (memmap) and Go memory
// (tensordict). Callers check indices and sizes first; these functions
// assume them and panic on a violation like any slice expression.
package rowcopy

// Gather copies row r of src (rows of rowBytes bytes) to row i of dst, for
// each rows[i] = r.
func Gather(dst, src []byte, rowBytes int, rows []int) {
	for i, r := range rows {
		copy(dst[i*rowBytes:(i+1)*rowBytes], src[r*rowBytes:(r+1)*rowBytes])
	}
}

// Scatter copies row i of src to row r of dst, for each rows[i] = r; when a
// row repeats, the last copy wins.
func Scatter(dst, src []byte, rowBytes int, rows []int) {
	for i, r := range rows {
		copy(dst[r*rowBytes:(r+1)*rowBytes], src[i*rowBytes:(i+1)*rowBytes])
	}
}

// Fill sets every element of the given rows of dst to elem, whose length
// divides rowBytes. The first row is filled by doubling the copied prefix,
// so a large row costs a few memmoves, not one per element; the others are
// copies of it.
func Fill(dst []byte, rowBytes int, rows []int, elem []byte) {
	if len(rows) == 0 || rowBytes == 0 {
		return
	}
	first := dst[rows[0]*rowBytes : (rows[0]+1)*rowBytes]
	n := copy(first, elem)
	for n < len(first) {
		n += copy(first[n:], first[:n])
	}
	for _, r := range rows[1:] {
		copy(dst[r*rowBytes:(r+1)*rowBytes], first)
	}
}
