//go:build !linux

package main

import (
	"context"
	"errors"
)

// watchExit calls exited, once, on a goroutine of its own, when process
// pid exits, unless ctx ends first. Here that can be seen only of this
// process's parent: it looks every 250 ms whether its parent changed.
func watchExit(ctx context.Context, pid int, exited func()) error {
	return watchParentChange(ctx, pid, exited, errors.New("no pidfd"))
}
