//go:build !linux

package main

import (
	"context"
	"os"
)

// watchHangup does not watch here: the sidecar reads its stdin on a
// goroutine of its own instead.
func watchHangup(context.Context, *os.File, func()) bool { return false }
