package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// Sentinels of a service built on rpc, registered as a package would.
var (
	errTestExpired   = errors.New("rpctest: expired")
	errTestContended = errors.New("rpctest: contended")
	errTestMissing   = errors.New("rpctest: missing")
	errUnregistered  = errors.New("rpctest: not registered")
)

func init() {
	RegisterReason(errTestExpired, Aborted, "rpctest.expired")
	RegisterReason(errTestContended, Aborted, "rpctest.contended")
	RegisterReason(errTestMissing, NotFound, "rpctest.missing")
}

// uncomparableError is an error type == cannot compare.
type uncomparableError []string

func (e uncomparableError) Error() string { return strings.Join(e, ", ") }

func TestRegisterReason_Refusals(t *testing.T) {
	fresh := errors.New("rpctest: fresh")
	for _, tc := range []struct {
		name     string
		sentinel error
		code     Code
		reason   string
	}{
		{"nil sentinel", nil, Aborted, "rpctest.nil"},
		{"uncomparable sentinel", uncomparableError{"x"}, Aborted, "rpctest.uncomparable"},
		{"code OK", fresh, OK, "rpctest.ok"},
		{"empty reason", fresh, Aborted, ""},
		{"reason too long", fresh, Aborted, strings.Repeat("r", maxReason+1)},
		{"space in the reason", fresh, Aborted, "rpctest.two words"},
		{"non-ASCII reason", fresh, Aborted, "rpctest.é"},
		{"sentinel registered", errTestExpired, Aborted, "rpctest.again"},
		{"reason registered", fresh, Aborted, "rpctest.expired"},
		{"reason registered under another code", fresh, NotFound, "rpctest.expired"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("RegisterReason(%v, %v, %q) did not panic", tc.sentinel, tc.code, tc.reason)
				}
			}()
			RegisterReason(tc.sentinel, tc.code, tc.reason)
		})
	}
	// Nothing refused was registered.
	if _, ok := registered(fresh); ok {
		t.Fatal("a refused sentinel was registered")
	}
	if !validReason(strings.Repeat("r", maxReason)) || !validReason("a.B_c-9") {
		t.Fatal("a well-formed reason refused")
	}
}

// TestError_IsReason checks what an error that arrived with a code and a
// reason matches, on the caller's side where it has no local cause.
func TestError_IsReason(t *testing.T) {
	expired := &Error{Code: Aborted, Reason: "rpctest.expired", Msg: "anything at all"}
	for _, tc := range []struct {
		name   string
		err    error
		target error
		want   bool
	}{
		{"its sentinel", expired, errTestExpired, true},
		{"its sentinel, wrapped", fmt.Errorf("extend: %w", expired), errTestExpired, true},
		{"its code", expired, ErrAborted, true},
		{"another reason under the code", expired, errTestContended, false},
		{"another code", expired, errTestMissing, false},
		{"an unregistered error", expired, errUnregistered, false},
		{"the reason under another code", &Error{Code: NotFound, Reason: "rpctest.expired"}, errTestExpired, false},
		{"no reason (an older peer)", &Error{Code: Aborted, Msg: "rpctest: expired"}, errTestExpired, false},
		{"no reason, its code", &Error{Code: Aborted, Msg: "rpctest: expired"}, ErrAborted, true},
		{"an unknown reason (a newer peer), its code", &Error{Code: Aborted, Reason: "rpctest.future"}, ErrAborted, true},
		{"an *Error sentinel with the reason", expired, &Error{Code: Aborted, Reason: "rpctest.expired"}, true},
		{"an *Error sentinel with another reason", expired, &Error{Code: Aborted, Reason: "rpctest.contended"}, false},
		{"an uncomparable target", expired, uncomparableError{"x"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := errors.Is(tc.err, tc.target); got != tc.want {
				t.Fatalf("errors.Is(%#v, %v) = %v, want %v", tc.err, tc.target, got, tc.want)
			}
		})
	}
}

// TestError_LocalReason checks the code and reason a handler's error is
// sent with (asError) and what CodeOf says of it.
func TestError_LocalReason(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   Code
		reason string
	}{
		{"a sentinel", errTestExpired, Aborted, "rpctest.expired"},
		{"a wrapped sentinel", fmt.Errorf("commit 7: %w", errTestMissing), NotFound, "rpctest.missing"},
		{"two sentinels: the first registered", fmt.Errorf("%w, %w", errTestContended, errTestExpired), Aborted, "rpctest.expired"},
		{"Errorf around a sentinel, its code", Errorf(Aborted, "retry: %w", errTestExpired), Aborted, "rpctest.expired"},
		{"Errorf around a sentinel, another code", Errorf(Internal, "%w", errTestExpired), Internal, ""},
		{"Errorf around a received error", Errorf(Aborted, "upstream: %w", &Error{Code: Aborted, Reason: "rpctest.future"}), Aborted, "rpctest.future"},
		{"an unregistered error", errUnregistered, Unknown, ""},
		{"an *Error", Errorf(NotFound, "no %s", "x"), NotFound, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := asError(tc.err)
			if e.Code != tc.code || e.Reason != tc.reason {
				t.Fatalf("asError(%v) = %v %q, want %v %q", tc.err, e.Code, e.Reason, tc.code, tc.reason)
			}
			if got := CodeOf(tc.err); got != tc.code {
				t.Fatalf("CodeOf(%v) = %v, want %v", tc.err, got, tc.code)
			}
		})
	}
}

func TestError_Timeout(t *testing.T) {
	for code := range Code(17) {
		e := &Error{Code: code}
		var ne net.Error
		if !errors.As(fmt.Errorf("call: %w", e), &ne) {
			t.Fatal("*Error is not a net.Error")
		}
		want := code == DeadlineExceeded
		if ne.Timeout() != want || e.Temporary() != want {
			t.Errorf("%v: Timeout %v, Temporary %v; want %v", code, ne.Timeout(), e.Temporary(), want)
		}
	}
}

// TestCall_Reason calls handlers that return sentinels in several ways: a
// caller matches them by code and reason, whatever their messages say.
func TestCall_Reason(t *testing.T) {
	s, addr := startServer(t)
	errs := []error{
		fmt.Errorf("the message is free text; it ends with %w", errTestExpired),
		errTestMissing,
		Errorf(Aborted, "commit %d: %w", 7, errTestContended),
		Errorf(Internal, "%w", errTestExpired),                               // another code: no reason
		&Error{Code: Aborted, Reason: "not a reason!", Msg: "malformed"},     // not sent
		&Error{Code: Aborted, Reason: "rpctest.unregistered", Msg: "ad hoc"}, // sent as is
		errUnregistered,
	}
	must(t, Register(s, "test.fail", func(_ context.Context, i int) (Empty, error) { return Empty{}, errs[i] }))
	c := dial(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, tc := range []struct {
		code   Code
		reason string
		is     error
	}{
		{Aborted, "rpctest.expired", errTestExpired},
		{NotFound, "rpctest.missing", errTestMissing},
		{Aborted, "rpctest.contended", errTestContended},
		{Internal, "", nil},
		{Aborted, "", nil},
		{Aborted, "rpctest.unregistered", &Error{Code: Aborted, Reason: "rpctest.unregistered"}},
		{Unknown, "", nil},
	} {
		_, err := Call[Empty](ctx, c, "test.fail", i)
		e, ok := errors.AsType[*Error](err)
		if !ok || e.Code != tc.code || e.Reason != tc.reason {
			t.Errorf("error %d: %#v; want code %v, reason %q", i, err, tc.code, tc.reason)
			continue
		}
		if want := asError(errs[i]).Msg; e.Msg != want {
			t.Errorf("error %d: message %q, want %q", i, e.Msg, want)
		}
		for _, s := range []error{errTestExpired, errTestContended, errTestMissing} {
			if got := errors.Is(err, s); got != (s == tc.is) {
				t.Errorf("error %d: errors.Is(%v, %v) = %v", i, err, s, got)
			}
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Errorf("error %d: %v does not match %v", i, err, tc.is)
		}
	}
}
