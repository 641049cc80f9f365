//go:build unix

package rpc

import (
	"errors"
	"net"
	"syscall"
)

// peek tells, without blocking or consuming anything, what an idle TCP
// connection has to read: nothing yet (peekEmpty), bytes (peekData), or
// its end: the peer closed or reset it (peekClosed). peekUnknown when c is
// not a connection it can look into.
func peek(c net.Conn) peekState {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return peekUnknown
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return peekUnknown
	}
	var (
		buf  [1]byte
		n    int
		rerr error
	)
	if err := raw.Read(func(fd uintptr) bool {
		n, _, rerr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return peekClosed // the connection is closed on this side
	}
	switch {
	case errors.Is(rerr, syscall.EAGAIN), errors.Is(rerr, syscall.EWOULDBLOCK), errors.Is(rerr, syscall.EINTR):
		return peekEmpty
	case rerr != nil, n == 0:
		return peekClosed
	}
	return peekData
}
