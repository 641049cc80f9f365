package mlp

import (
	"fmt"
	"unsafe"
)

// float32s views b, which holds little-endian float32 values and is
// aligned for them (tensordict's memory and mappings are), as a []float32.
func float32s(b []byte) ([]float32, error) {
	if len(b)%4 != 0 || (len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0) {
		return nil, fmt.Errorf("%d bytes, not aligned float32 values", len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), nil
}
