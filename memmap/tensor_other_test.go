//go:build !linux

package memmap

import (
	"errors"
	"testing"
)

func TestTensor_EvictUnsupported(t *testing.T) {
	m := mustCreate(t, Uint8, 4, 4)
	if err := m.Evict(); !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("Evict: err = %v, want errors.ErrUnsupported", err)
	}
}
