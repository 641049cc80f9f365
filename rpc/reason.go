package rpc

import (
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
)

// A reason gives an error condition an identity that crosses the wire: the
// response header carries it next to the code (docs/protocol.md), and a
// sentinel registered with it matches the error on the caller's side. The
// reasons a service sends are part of its protocol; its messages are free
// text.

// RegisterReason makes errors that match sentinel cross the wire with code
// and reason, and makes errors that arrive with code and reason match
// sentinel again:
//
//   - A handler's error that matches sentinel (errors.Is) and is not an
//     *Error reaches the caller with code and reason; so does Errorf(code,
//     "...%w...", sentinel). CodeOf(err) is code.
//   - On the caller's side, errors.Is(err, sentinel) holds for an *Error with
//     code and reason, besides errors.Is(err, the code's sentinel).
//
// A package registers each of its sentinels once, from init, one line each:
//
//	func init() {
//		rpc.RegisterReason(ErrExpired, rpc.Aborted, "replay.expired")
//	}
//
// Both sides of a call must register the sentinel, as they do when both
// import the package that does; a caller that has not matches such errors
// by code alone, as it does those of a peer that sends no reason. reason is
// 1 to 64 ASCII letters, digits, '.', '_' or '-', by convention the
// package's name, a dot and the condition. A handler's error that matches
// several registered sentinels takes the first registered.
//
// RegisterReason panics, as sql.Register does, if sentinel is nil or not
// comparable, code is OK, reason is malformed, or sentinel or reason is
// registered already: these are mistakes in a program's setup. It is safe
// for concurrent use with everything else in the package.
func RegisterReason(sentinel error, code Code, reason string) {
	switch {
	case sentinel == nil:
		panic("rpc: RegisterReason of a nil error")
	case !reflect.TypeOf(sentinel).Comparable():
		panic(fmt.Sprintf("rpc: RegisterReason of an error of the uncomparable type %T", sentinel))
	case code == OK:
		panic(fmt.Sprintf("rpc: RegisterReason(%q) with code OK", reason))
	case !validReason(reason):
		panic(fmt.Sprintf("rpc: RegisterReason: malformed reason %q", reason))
	}
	reasons.mu.Lock()
	defer reasons.mu.Unlock()
	var list []reasonEntry
	if l := reasons.list.Load(); l != nil {
		list = *l
	}
	for _, r := range list {
		if r.sentinel == sentinel || r.reason == reason {
			panic(fmt.Sprintf("rpc: RegisterReason(%q, %q): %q is registered already for %q", sentinel, reason, r.reason, r.sentinel))
		}
	}
	list = append(list[:len(list):len(list)], reasonEntry{sentinel: sentinel, code: code, reason: reason})
	reasons.list.Store(&list)
}

// maxReason bounds a reason's length.
const maxReason = 64

// validReason reports whether r is a well-formed reason.
func validReason(r string) bool {
	if len(r) == 0 || len(r) > maxReason {
		return false
	}
	for _, c := range []byte(r) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

type reasonEntry struct {
	sentinel error
	code     Code
	reason   string
}

// reasons is the registry. Readers load list without a lock; RegisterReason
// replaces it with a longer copy under mu.
var reasons struct {
	mu   sync.Mutex
	list atomic.Pointer[[]reasonEntry]
}

// registered returns the entry of the first registered sentinel that err
// matches.
func registered(err error) (reasonEntry, bool) {
	if l := reasons.list.Load(); l != nil && err != nil {
		for _, r := range *l {
			if errors.Is(err, r.sentinel) {
				return r, true
			}
		}
	}
	return reasonEntry{}, false
}

// registeredAs returns the entry of target when it is a registered
// sentinel.
func registeredAs(target error) (reasonEntry, bool) {
	if l := reasons.list.Load(); l != nil {
		for _, r := range *l {
			// Registered sentinels are comparable, so == cannot panic: a
			// target of another type compares unequal.
			if r.sentinel == target {
				return r, true
			}
		}
	}
	return reasonEntry{}, false
}
