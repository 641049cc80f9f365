//go:build !linux

package memmap

// prefetch does nothing outside Linux: cold rows are read one page fault at a
// time, as the operating system's own readahead allows. See
// prefetch_linux.go for what Linux gets.
func (t *Tensor) prefetch(off int64, rowBytes int, rows []int) {}
