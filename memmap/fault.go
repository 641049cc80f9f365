package memmap

import (
	"fmt"
	"runtime/debug"
)

// Guard runs fn, turning a memory fault inside it (SIGBUS or SIGSEGV on a
// mapping, e.g. after its file was truncated by another process) into an
// error wrapping ErrFault; otherwise it returns fn's error. Other panics,
// a nil dereference among them, pass through unchanged.
//
// It is the guard this package's copies run under, for code that touches a
// mapping through a slice (Bytes, or a mapping of its own): the fault ends
// fn, not the process. debug.SetPanicOnFault is per goroutine and cheap;
// Guard restores the previous setting, so guards nest.
func Guard(fn func() error) error { return guard("", fn) }

// guarded is Guard for this package's copies: the error names the file.
func guarded(path string, fn func()) error {
	return guard(path+" ", func() error { fn(); return nil })
}

func guard(what string, fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			f, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%w: %sat address %#x (was the file truncated?)", ErrFault, what, f.Addr())
		}
	}()
	return fn()
}

// CheckFile returns an error wrapping ErrFault when the tensor's file has
// become shorter than its data (someone truncated it while it was mapped),
// so that touching the missing pages would fault; nil otherwise. A caller
// about to commit to sending the data (a message whose header already gave
// its length) checks first, and can refuse the whole message instead of
// breaking off midway. It says nothing of a truncation after it returns:
// the copies stay guarded.
func (t *Tensor) CheckFile() error {
	if err := t.acquire(false); err != nil {
		return err
	}
	defer t.mu.RUnlock()
	fi, err := t.f.Stat()
	if err != nil {
		return fmt.Errorf("%s: %w", t.path, err)
	}
	if fi.Size() < int64(t.size) {
		return fmt.Errorf("%w: %s holds %d bytes of its %d (was the file truncated?)", ErrFault, t.path, fi.Size(), t.size)
	}
	return nil
}
