//go:build !linux

package benchkit

import (
	"errors"
	"fmt"
)

// Resident would report how many of the memory pages that b spans are
// resident. Outside Linux residency is unknown here: it returns an error
// wrapping errors.ErrUnsupported.
func Resident(b []byte) (resident, pages int, err error) {
	return 0, 0, fmt.Errorf("resident pages: %w: needs Linux", errors.ErrUnsupported)
}

// DropMappings would drop this process's page-table entries for the file
// that b maps (see pages_linux.go). Outside Linux it returns an error
// wrapping errors.ErrUnsupported.
func DropMappings(b []byte) (int, error) {
	return 0, fmt.Errorf("drop mappings: %w: needs Linux and /proc/self/maps", errors.ErrUnsupported)
}
