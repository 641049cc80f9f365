package memmap

import (
	"fmt"
	"runtime/debug"
)

// guarded runs fn, turning a memory fault inside it (SIGBUS or SIGSEGV on the
// mapping, e.g. after the file was truncated by another process) into an
// error wrapping ErrFault. Other panics pass through unchanged.
//
// debug.SetPanicOnFault is per goroutine and cheap; guarded restores the
// previous setting.
func guarded(path string, fn func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%w: %s at address %#x (was the file truncated?)", ErrFault, path, f.Addr())
		}
	}()
	fn()
	return nil
}
