//go:build !linux

package serve

import (
	"errors"
	"os"
	"time"
)

// bellSupported is false off Linux: requests by reference are calls.
const bellSupported = false

var errNoBell = errors.New("serve: shared-memory requests need Linux")

func createShared(string, int) ([]byte, error) { return nil, errNoBell }
func openShared(*os.File, int) ([]byte, error) { return nil, errNoBell }
func unmapShared([]byte)                       {}
func futexWait(*uint32, uint32, time.Duration) {}
func futexWake(*uint32)                        {}
