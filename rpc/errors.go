package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/tensorwire/tensorwire/memmap"
	"github.com/tensorwire/tensorwire/tensordict"
)

// Code classifies an error that crossed the wire. The values and meanings
// are gRPC's (google.golang.org/grpc/codes), so logs and dashboards read the
// same; they are part of the wire format and never change.
type Code uint8

// The codes. OK is never the code of an *Error.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

var codeNames = [...]string{
	"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition",
	"Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable", "DataLoss",
	"Unauthenticated",
}

// String returns the code's gRPC name, such as "InvalidArgument".
func (c Code) String() string {
	if int(c) < len(codeNames) {
		return codeNames[c]
	}
	return fmt.Sprintf("Code(%d)", uint8(c))
}

// Error is an error with a Code: returned by calls whose handler failed or
// that could not be carried out, and returned by handlers that want the
// caller to see a particular code.
//
// errors.Is(err, ErrX) matches any *Error with ErrX's code, so callers branch
// with errors.Is(err, rpc.ErrNotFound). A DeadlineExceeded or Canceled error
// also matches context.DeadlineExceeded or context.Canceled. An error with a
// Reason also matches the sentinel registered with its code and reason
// (RegisterReason), so errors.Is(err, replay.ErrExpired) holds on the
// caller's side of the wire.
//
// *Error implements net.Error: Timeout reports DeadlineExceeded.
type Error struct {
	Code Code
	// Reason names the condition more finely than Code, as a stable token
	// such as "replay.expired" (RegisterReason); "" when there is none. It
	// crosses the wire with the code, and with the code it is what callers
	// match; Msg is free text for people.
	Reason string
	Msg    string
	err    error // the local cause, when there is one (never sent)
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return "rpc: " + e.Code.String()
	}
	return "rpc: " + e.Code.String() + ": " + e.Msg
}

// Is reports whether target is a sentinel *Error with e's code (and, when
// the sentinel has a reason, e's reason), the context error that e's code
// stands for, or the sentinel registered with e's code and reason.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *Error:
		return t.Msg == "" && t.err == nil && t.Code == e.Code && (t.Reason == "" || t.Reason == e.Reason)
	}
	switch target {
	case context.DeadlineExceeded:
		return e.Code == DeadlineExceeded
	case context.Canceled:
		return e.Code == Canceled
	}
	if e.Reason != "" {
		if r, ok := registeredAs(target); ok {
			return r.code == e.Code && r.reason == e.Reason
		}
	}
	return false
}

// Unwrap returns the local cause of e, if any: the error that produced it on
// this side of the wire. Errors decoded from a peer have none.
func (e *Error) Unwrap() error { return e.err }

// Timeout reports whether e is a DeadlineExceeded: the call's deadline
// passed before the node answered. (As net.Error's Timeout.)
func (e *Error) Timeout() bool { return e.Code == DeadlineExceeded }

// Temporary reports the same as Timeout, as the standard library's deadline
// errors do. It is there to make *Error a net.Error, whose Temporary is
// deprecated: branch on Timeout or on the codes instead.
func (e *Error) Temporary() bool { return e.Timeout() }

var _ net.Error = (*Error)(nil)

// Sentinels for errors.Is, one per code.
var (
	ErrCanceled           = &Error{Code: Canceled}
	ErrUnknown            = &Error{Code: Unknown}
	ErrInvalidArgument    = &Error{Code: InvalidArgument}
	ErrDeadlineExceeded   = &Error{Code: DeadlineExceeded}
	ErrNotFound           = &Error{Code: NotFound}
	ErrAlreadyExists      = &Error{Code: AlreadyExists}
	ErrPermissionDenied   = &Error{Code: PermissionDenied}
	ErrResourceExhausted  = &Error{Code: ResourceExhausted}
	ErrFailedPrecondition = &Error{Code: FailedPrecondition}
	ErrAborted            = &Error{Code: Aborted}
	ErrOutOfRange         = &Error{Code: OutOfRange}
	ErrUnimplemented      = &Error{Code: Unimplemented}
	ErrInternal           = &Error{Code: Internal}
	ErrUnavailable        = &Error{Code: Unavailable}
	ErrDataLoss           = &Error{Code: DataLoss}
	ErrUnauthenticated    = &Error{Code: Unauthenticated}
)

// Errorf returns an *Error with the given code and a formatted message. A %w
// verb keeps its operand as the local cause (for errors.Is on this side);
// only the text crosses the wire, with the cause's reason when the cause
// has one under the same code (a registered sentinel, or an *Error).
func Errorf(code Code, format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	e := &Error{Code: code, Msg: err.Error(), err: errors.Unwrap(err)}
	if c, reason, ok := identity(e.err); ok && c == code {
		e.Reason = reason
	}
	return e
}

// CodeOf returns the code an error would carry across the wire: an *Error's
// own code; the code of the registered sentinel it matches
// (RegisterReason); and for other errors the code their cause implies (an
// index out of range is InvalidArgument, a missing file NotFound, and so
// on). nil is OK; an error with no known cause is Unknown.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	if code, _, ok := identity(err); ok {
		return code
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return Canceled
	case errors.Is(err, memmap.ErrIndex), errors.Is(err, memmap.ErrShape),
		errors.Is(err, memmap.ErrDType), errors.Is(err, memmap.ErrShortFile),
		errors.Is(err, tensordict.ErrBatchSize), errors.Is(err, tensordict.ErrSchema),
		errors.Is(err, tensordict.ErrKey), errors.Is(err, tensordict.ErrFormat):
		return InvalidArgument
	case errors.Is(err, tensordict.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return NotFound
	case errors.Is(err, os.ErrPermission), errors.Is(err, memmap.ErrReadOnly):
		return PermissionDenied
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ResourceExhausted // the node's disk is full
	case errors.Is(err, tensordict.ErrLocked), errors.Is(err, tensordict.ErrUnsupported):
		return FailedPrecondition
	case errors.Is(err, memmap.ErrFault):
		return DataLoss
	case errors.Is(err, memmap.ErrClosed):
		return Unavailable
	}
	return Unknown
}

// identity returns the code and reason that err carries itself: those of
// the first *Error in its chain, else those of the first registered
// sentinel it matches. ok is false when it has neither.
func identity(err error) (code Code, reason string, ok bool) {
	if err == nil {
		return OK, "", false
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code, e.Reason, true
	}
	if r, ok := registered(err); ok {
		return r.code, r.reason, true
	}
	return OK, "", false
}

// asError returns err as an *Error, giving it the code (and reason) CodeOf
// finds and keeping err as the local cause.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if r, ok := registered(err); ok {
		return &Error{Code: r.code, Reason: r.reason, Msg: err.Error(), err: err}
	}
	return &Error{Code: CodeOf(err), Msg: err.Error(), err: err}
}

// transportError turns an error from the connection into the error a caller
// sees: its context's error when that ended the call, Unavailable otherwise
// (the peer died, the connection broke, or its deadline passed without the
// context's).
func transportError(ctx context.Context, op string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		code := Canceled
		if errors.Is(cerr, context.DeadlineExceeded) {
			code = DeadlineExceeded
		}
		return &Error{Code: code, Msg: op + ": " + cerr.Error(), err: cerr}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &Error{Code: DeadlineExceeded, Msg: op + ": " + err.Error(), err: err}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		// Wrapping io.ErrUnexpectedEOF, never io.EOF: errors.Is(err, io.EOF)
		// means a stream's clean end to its reader, never a broken connection.
		return &Error{Code: Unavailable, Msg: op + ": connection closed by peer", err: io.ErrUnexpectedEOF}
	}
	return &Error{Code: Unavailable, Msg: op + ": " + err.Error(), err: err}
}
