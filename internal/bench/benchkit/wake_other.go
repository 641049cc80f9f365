//go:build !linux

package benchkit

import (
	"errors"
	"fmt"
)

// MeasureWake would measure Wake. Outside Linux threads are not pinned
// here: it returns an error wrapping errors.ErrUnsupported, and reports
// leave the wake-up figure out.
func MeasureWake() (Wake, error) {
	return Wake{}, fmt.Errorf("wake-up round trip: %w outside Linux", errors.ErrUnsupported)
}
