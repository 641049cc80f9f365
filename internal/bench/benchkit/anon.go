package benchkit

import "github.com/tensorwire/tensorwire/internal/shm"

// Anon maps n bytes of anonymous memory outside the Go heap (shm.Private,
// MAP_PRIVATE as malloc's memory is), every page touched, so that it
// neither counts as Go heap nor faults when measured. Release it with Free.
func Anon(n int) ([]byte, error) {
	b, err := shm.Private(n)
	if err != nil {
		return nil, err
	}
	Fill(b, 0xa5)
	return b, nil
}

// Free unmaps a buffer from Anon.
func Free(b []byte) error { return shm.FreePrivate(b) }
