package memmap

import (
	"fmt"
	"math"
	"slices"
)

// NumElements returns the product of shape's dimensions: 1 for a scalar
// (empty shape), 0 if any dimension is 0 however large the others are. It
// returns an error wrapping ErrShape for a negative dimension or a product
// that overflows int.
func NumElements(shape []int) (int, error) {
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dimension in %v", ErrShape, shape)
		}
	}
	if slices.Contains(shape, 0) {
		return 0, nil
	}
	n := 1
	for _, d := range shape {
		if n > math.MaxInt/d {
			return 0, fmt.Errorf("%w: %v has too many elements", ErrShape, shape)
		}
		n *= d
	}
	return n, nil
}

// NumBytes returns the byte size of a C-order array of dtype dt and shape
// shape, with the errors of NumElements, and ErrDType for an invalid dtype.
func NumBytes(dt DType, shape []int) (int, error) {
	if !dt.Valid() {
		return 0, fmt.Errorf("%w: %v", ErrDType, dt)
	}
	n, err := NumElements(shape)
	if err != nil {
		return 0, err
	}
	if n > math.MaxInt/dt.Size() {
		return 0, fmt.Errorf("%w: %v of %v overflows", ErrShape, shape, dt)
	}
	return n * dt.Size(), nil
}

// RowBytes returns the byte size of one row (one index of the first
// dimension) of an array of dtype dt and shape shape. It is 0 for a scalar,
// which has no rows.
func RowBytes(dt DType, shape []int) int {
	if len(shape) == 0 {
		return 0
	}
	n, err := NumBytes(dt, shape[1:])
	if err != nil {
		return 0
	}
	return n
}

// CheckRows returns an error wrapping ErrIndex if any of rows is outside
// [0, n). Callers check every index before touching data, so a bad index
// leaves the data as it was.
func CheckRows(rows []int, n int) error {
	for i, r := range rows {
		if r < 0 || r >= n {
			return fmt.Errorf("%w: row %d (position %d) not in [0, %d)", ErrIndex, r, i, n)
		}
	}
	return nil
}
