//go:build !linux

package memmap

// direct is empty outside Linux: every write goes through the mapping. See
// direct_linux.go for what Linux does with rows whose pages are not
// resident.
type direct struct{}

// initDirect does nothing outside Linux.
func (t *Tensor) initDirect() {}

// scatter, fill and write are ScatterAt's, FillAt's and WriteAt's writes,
// through the mapping here. The caller holds t.mu.
func (t *Tensor) scatter(off int64, rowBytes int, rows []int, src []byte) error {
	return t.scatterMapped(off, rowBytes, rows, src)
}

func (t *Tensor) fill(off int64, rowBytes int, rows []int, elem []byte) error {
	return t.fillMapped(off, rowBytes, rows, elem)
}

func (t *Tensor) write(p []byte, off int64) (int, error) {
	return t.writeMapped(p, off)
}

// InPlace marks t as a file rewritten in place for its whole life. Outside
// Linux every write goes through the mapping already: it does nothing.
func (t *Tensor) InPlace() {}
