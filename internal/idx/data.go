package idx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// dataReader reads the data section of a file from src, converting words of
// width bytes from big-endian to little-endian. It hands out whole words only
// from src, keeping a word split by a short p in buf for the next call, and
// it never allocates: memory use does not depend on the size the header
// claims.
type dataReader struct {
	src   io.Reader
	width int   // bytes swapped as a unit: 1 (no swap), 2, 4 or 8
	total int64 // data size from the header
	left  int64 // data bytes not yet taken from src; a multiple of width
	buf   [8]byte
	off   int   // buf[off:width] is converted data not yet returned
	err   error // sticky; set once the data is done or broken
}

func newDataReader(src io.Reader, width int, total int64) *dataReader {
	return &dataReader{src: src, width: width, total: total, left: total, off: width}
}

// Read implements io.Reader. After the last data byte it returns io.EOF if
// src ends there too, and an error wrapping ErrFormat if it does not.
func (d *dataReader) Read(p []byte) (int, error) {
	if d.off < d.width {
		n := copy(p, d.buf[d.off:d.width])
		d.off += n
		return n, nil
	}
	if d.err != nil {
		return 0, d.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if d.left == 0 {
		d.err = d.end()
		return 0, d.err
	}
	if len(p) < d.width {
		n, err := d.words(d.buf[:d.width])
		if n == 0 {
			return 0, err
		}
		d.off = copy(p, d.buf[:d.width])
		return d.off, nil // a sticky err comes once buf is drained
	}
	m := min(int64(len(p)), d.left)
	return d.words(p[:m-m%int64(d.width)])
}

// words reads at most len(p) bytes into p, where len(p) is a positive
// multiple of the width no larger than d.left, and converts them. Like
// Read, it may return fewer bytes than len(p), but always whole words.
func (d *dataReader) words(p []byte) (int, error) {
	n, err := d.src.Read(p)
	if r := n % d.width; r != 0 && err == nil {
		var k int
		k, err = io.ReadFull(d.src, p[n:n+d.width-r])
		n += k
	}
	partial := n % d.width
	n -= partial
	swap(p[:n], d.width)
	d.left -= int64(n)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if d.left == 0 {
			err = nil // the data ends where src does; d.end will see EOF again
			break
		}
		got := d.total - d.left + int64(partial)
		d.err = fmt.Errorf("%w: data ends after %d of %d bytes: %w", ErrFormat, got, d.total, io.ErrUnexpectedEOF)
	default:
		d.err = readError("reading data", err)
	}
	return n, d.err
}

// end checks that src holds nothing after the data. For gzip input, reading
// to the end of the stream is also what verifies its checksum.
func (d *dataReader) end() error {
	var b [1]byte
	n, err := io.ReadAtLeast(d.src, b[:], 1)
	switch {
	case n > 0:
		return fmt.Errorf("%w: trailing bytes after the %d data bytes", ErrFormat, d.total)
	case errors.Is(err, io.EOF):
		return io.EOF
	default:
		return readError("checking for bytes after the data", err)
	}
}

// swap converts the big-endian words of the given width in p, whose length
// is a multiple of width, to little-endian in place.
func swap(p []byte, width int) {
	switch width {
	case 2:
		for i := 0; i+2 <= len(p); i += 2 {
			binary.LittleEndian.PutUint16(p[i:], binary.BigEndian.Uint16(p[i:]))
		}
	case 4:
		for i := 0; i+4 <= len(p); i += 4 {
			binary.LittleEndian.PutUint32(p[i:], binary.BigEndian.Uint32(p[i:]))
		}
	case 8:
		for i := 0; i+8 <= len(p); i += 8 {
			binary.LittleEndian.PutUint64(p[i:], binary.BigEndian.Uint64(p[i:]))
		}
	}
}
