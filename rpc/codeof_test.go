package rpc

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/tensorwire/tensorwire/memmap"
)

// A handler's error reaches the caller with the code its cause stands for.
func TestCodeOf(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("fill: %w", err) }
	for _, tc := range []struct {
		err  error
		want Code
	}{
		{nil, OK},
		{wrap(context.DeadlineExceeded), DeadlineExceeded},
		{wrap(memmap.ErrIndex), InvalidArgument},
		{wrap(os.ErrNotExist), NotFound},
		{wrap(os.ErrPermission), PermissionDenied},
		{wrap(&os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC}), ResourceExhausted},
		{wrap(memmap.ErrFault), DataLoss},
		{wrap(Errorf(Aborted, "x")), Aborted},
		{fmt.Errorf("something else"), Unknown},
	} {
		if got := CodeOf(tc.err); got != tc.want {
			t.Errorf("CodeOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
