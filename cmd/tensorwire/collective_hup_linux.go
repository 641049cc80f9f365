//go:build linux

package main

import (
	"context"
	"os"

	"golang.org/x/sys/unix"
)

// watchHangup calls gone once f, the read end of a pipe, has no writer
// left (POLLHUP), and reports whether it watches. poll with no events
// asked still reports the hang-up, and never the data, which the caller
// reads meanwhile.
func watchHangup(ctx context.Context, f *os.File, gone func()) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return false
	}
	fd := int(f.Fd())
	go func() {
		fds := []unix.PollFd{{Fd: int32(fd), Events: 0}}
		for ctx.Err() == nil {
			n, err := unix.Poll(fds, 1000)
			if err == unix.EINTR || n == 0 {
				continue
			}
			if err != nil || fds[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
				gone()
				return
			}
		}
	}()
	return true
}
