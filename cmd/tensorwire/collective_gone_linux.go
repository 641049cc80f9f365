//go:build linux

package main

import (
	"context"
	"os"

	"golang.org/x/sys/unix"
)

// watchGone calls hangup once f, the read end of the pipe from the Python
// process, has no writer left (POLLHUP), or exited once process ppid,
// that Python process (when over 1), has exited, whichever comes first
// (one call, on a goroutine of its own); it reports whether it watches.
// The second matters where the process forked children before it died
// (DataLoader workers, multiprocessing): they hold the pipe's write end,
// so the hang-up comes only when the last of them goes, and the other
// ranks would wait for this one meanwhile. ppid is watched through a
// pidfd (pidFD: Linux 5.3 on); where none can be had, the pipe alone.
// poll with no events asked for the pipe still reports its hang-up, and
// never its data, which the caller reads meanwhile.
func watchGone(ctx context.Context, f *os.File, ppid int, hangup, exited func()) bool {
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		return false
	}
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: 0}}
	if ppid > 1 {
		pfd, gone, err := pidFD(ppid)
		switch {
		case gone:
			go exited()
			return true
		case err == nil:
			fds = append(fds, unix.PollFd{Fd: int32(pfd), Events: unix.POLLIN})
		}
	}
	go func() {
		if len(fds) > 1 {
			defer unix.Close(int(fds[1].Fd))
		}
		// The pipe first: a parent that died with nobody else holding
		// it ends both at once, and the hang-up is the plain case.
		switch i, err := pollFirst(ctx, fds); {
		case err != nil || i == 0:
			hangup()
		case i == 1:
			exited()
		}
	}()
	return true
}
