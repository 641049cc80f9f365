//go:build linux

package main

import (
	"context"
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// pidFD opens a pidfd of process pid (Linux 5.3 on), or reports that the
// process has exited already (gone). Where pid is this process's parent,
// the parent still being pid once the pidfd is open rules out a pid
// reused since the parent exited.
func pidFD(pid int) (fd int, gone bool, err error) {
	parent := os.Getppid() == pid
	fd, err = unix.PidfdOpen(pid, 0)
	switch {
	case errors.Is(err, unix.ESRCH):
		return -1, true, nil
	case err != nil:
		return -1, false, err
	case parent && os.Getppid() != pid:
		unix.Close(fd)
		return -1, true, nil
	}
	return fd, false, nil
}

// watchExit calls exited, once, on a goroutine of its own, when process
// pid exits, unless ctx ends first; it fails where it cannot watch pid.
// It waits on a pidfd of pid; where none can be had (before Linux 5.3)
// it watches for this process's parent to change instead, which does
// only when pid is that parent.
func watchExit(ctx context.Context, pid int, exited func()) error {
	fd, gone, err := pidFD(pid)
	if err != nil {
		return watchParentChange(ctx, pid, exited, err)
	}
	if gone {
		go exited()
		return nil
	}
	go func() {
		defer unix.Close(fd)
		if i, err := pollFirst(ctx, []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}); i == 0 && err == nil {
			exited()
		}
	}()
	return nil
}

// pollFirst waits, in poll(2), until one of fds reports an event, and
// returns its index; -1 once ctx has ended (looked at every second), or
// with poll's error.
func pollFirst(ctx context.Context, fds []unix.PollFd) (int, error) {
	for ctx.Err() == nil {
		n, err := unix.Poll(fds, 1000)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return -1, err
		}
		for i, p := range fds {
			if p.Revents != 0 {
				return i, nil
			}
		}
	}
	return -1, nil
}
