// Package swap streams the data section of a binary file stored as
// big-endian words, converting it to little-endian on the fly. It is shared
// by the idx and npy decoders, which differ only in how errors are worded and
// in what they expect after the data.
package swap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// A Reader reads a fixed number of data bytes from an underlying reader,
// reversing the byte order of each word of a fixed width. It takes whole
// words only from the underlying reader, keeping a word split by a short
// Read buffer for the next call, and it never allocates except to build an
// error: its memory use does not depend on the data size it was given.
type Reader struct {
	src   io.Reader
	width int   // bytes swapped as a unit: 1 (no swap), 2, 4 or 8
	total int64 // data size
	left  int64 // data bytes not yet taken from src; a multiple of width
	buf   [8]byte
	off   int // buf[off:width] is converted data not yet returned

	errFormat error             // wrapped by the truncation error
	wrap      func(error) error // applied to other errors of src; may be nil
	end       func() error      // called once after the data; may be nil
	err       error             // sticky; set once the data is done or broken
}

// NewReader returns a Reader of the n bytes of data at the current position
// of src, stored as big-endian words of width bytes. Width must be 1, 2, 4
// or 8, and n a non-negative multiple of it; NewReader panics otherwise. A
// width of 1 copies the data unchanged.
//
// The Reader's Read behaves as follows:
//
//   - If src ends (with an error matching io.EOF or io.ErrUnexpectedEOF
//     under errors.Is) before n bytes, Read returns an error wrapping errFormat and
//     io.ErrUnexpectedEOF, whose message reads "data ends after G of N
//     bytes", G counting every data byte src held.
//   - Any other error err of src is returned as wrap(err), which must not
//     be nil, or as err itself if wrap is nil.
//   - After the last data byte, Read calls end once and returns its result
//     from then on, or io.EOF if end returns nil. If end is nil, Read returns
//     io.EOF and nothing past the data is ever read from src; end may read
//     on, for example to check that src holds nothing more.
//
// Errors are sticky: once Read has returned an error, it returns the same
// error value on every later call.
func NewReader(src io.Reader, width int, n int64, errFormat error, wrap func(error) error, end func() error) *Reader {
	if width != 1 && width != 2 && width != 4 && width != 8 {
		panic(fmt.Sprintf("swap: invalid word width %d", width))
	}
	if n < 0 || n%int64(width) != 0 {
		panic(fmt.Sprintf("swap: data size %d is not a non-negative multiple of width %d", n, width))
	}
	return &Reader{
		src: src, width: width, total: n, left: n, off: width,
		errFormat: errFormat, wrap: wrap, end: end,
	}
}

// Read implements io.Reader, filling p with converted data. It may return
// fewer bytes than len(p) while data remains, and it splits a word across
// calls only when len(p) is smaller than the width; see NewReader for the
// errors it returns.
func (d *Reader) Read(p []byte) (int, error) {
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
		d.err = io.EOF
		if d.end != nil {
			if err := d.end(); err != nil {
				d.err = err
			}
		}
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
func (d *Reader) words(p []byte) (int, error) {
	n, err := d.src.Read(p)
	if r := n % d.width; r != 0 && err == nil {
		var k int
		k, err = io.ReadFull(d.src, p[n:n+d.width-r])
		n += k
	}
	partial := n % d.width
	n -= partial
	Words(p[:n], d.width)
	d.left -= int64(n)
	switch {
	case err == nil:
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		if d.left == 0 {
			err = nil // the data ends where src does; d.end may see EOF again
			break
		}
		got := d.total - d.left + int64(partial)
		d.err = fmt.Errorf("%w: data ends after %d of %d bytes: %w", d.errFormat, got, d.total, io.ErrUnexpectedEOF)
	case d.wrap != nil:
		d.err = d.wrap(err)
	default:
		d.err = err
	}
	return n, d.err
}

// Words reverses the byte order of each word of width bytes in p, in place,
// converting big-endian words to little-endian or back. A width other than
// 2, 4 or 8 leaves p unchanged, and so does a trailing partial word.
func Words(p []byte, width int) {
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
