//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd || solaris || windows)

package lockfile

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// lock fails on a platform without a lock that the kernel drops when its
// holder dies: a lock file that a crash could leave behind would be worse
// than none.
func lock(*os.File) error {
	return fmt.Errorf("no process-owned file locks on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func unlock(*os.File) error { return nil }

// noFollow makes OpenFile fail on a symbolic link where the system can.
const noFollow = 0
