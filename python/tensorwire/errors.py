"""Errors as they cross the wire: a code and, optionally, a reason.

Every error a node returns carries one of gRPC's codes (docs/protocol.md,
"Error codes") and may carry a reason, a token such as ``replay.expired``
that names the condition more finely. Here each code is an exception class
(``InvalidArgumentError`` for code 3, ...), all subclasses of
``TensorwireError``, and each reason a service registers is a subclass of
its code's class (``tensorwire.replay.ExpiredError`` is an
``AbortedError``), matching the Go sentinel of the same reason. So::

    except tensorwire.replay.ExpiredError:   # reason replay.expired
    except tensorwire.AbortedError:          # any error of code Aborted

An error whose reason is not registered here is its code's class, with
``reason`` set.
"""

__all__ = [
    "TensorwireError", "CanceledError", "UnknownError", "InvalidArgumentError",
    "DeadlineExceededError", "NotFoundError", "AlreadyExistsError", "PermissionDeniedError",
    "ResourceExhaustedError", "FailedPreconditionError", "AbortedError", "OutOfRangeError",
    "UnimplementedError", "InternalError", "UnavailableError", "DataLossError",
    "UnauthenticatedError", "ClientClosedError", "error_class", "register_reason", "from_wire",
    "CODE_NAMES",
]

CODE_NAMES = {
    0: "OK", 1: "Canceled", 2: "Unknown", 3: "InvalidArgument", 4: "DeadlineExceeded",
    5: "NotFound", 6: "AlreadyExists", 7: "PermissionDenied", 8: "ResourceExhausted",
    9: "FailedPrecondition", 10: "Aborted", 11: "OutOfRange", 12: "Unimplemented",
    13: "Internal", 14: "Unavailable", 15: "DataLoss", 16: "Unauthenticated",
}


class TensorwireError(Exception):
    """An error with a code (an int, CODE_NAMES), an optional reason and a
    message. The message is free text for people; code and reason are what
    programs branch on."""

    code = 2
    reason = ""

    def __init__(self, message="", reason=None, code=None):
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        if code is not None:
            self.code = code

    @property
    def code_name(self):
        return CODE_NAMES.get(self.code, f"Code({self.code})")

    def __str__(self):
        return f"{self.code_name}: {self.message}" if self.message else self.code_name


class CanceledError(TensorwireError):
    code = 1


class UnknownError(TensorwireError):
    code = 2


class InvalidArgumentError(TensorwireError, ValueError):
    code = 3


class DeadlineExceededError(TensorwireError, TimeoutError):
    code = 4


class NotFoundError(TensorwireError):
    code = 5


class AlreadyExistsError(TensorwireError):
    code = 6


class PermissionDeniedError(TensorwireError):
    code = 7


class ResourceExhaustedError(TensorwireError):
    code = 8


class FailedPreconditionError(TensorwireError):
    code = 9


class AbortedError(TensorwireError):
    code = 10


class OutOfRangeError(TensorwireError):
    code = 11


class UnimplementedError(TensorwireError):
    code = 12


class InternalError(TensorwireError):
    code = 13


class UnavailableError(TensorwireError, ConnectionError):
    """The node could not be reached, the connection broke, or the node fell
    silent. A call that failed so may or may not have run on the node."""

    code = 14


class DataLossError(TensorwireError):
    code = 15


class UnauthenticatedError(TensorwireError):
    code = 16


class ClientClosedError(UnavailableError):
    """A call on a closed client (Go's rpc.ErrClosed). Not retried."""


_BY_CODE = {c.code: c for c in (
    CanceledError, UnknownError, InvalidArgumentError, DeadlineExceededError, NotFoundError,
    AlreadyExistsError, PermissionDeniedError, ResourceExhaustedError, FailedPreconditionError,
    AbortedError, OutOfRangeError, UnimplementedError, InternalError, UnavailableError,
    DataLossError, UnauthenticatedError)}

_BY_REASON = {}


def error_class(code):
    """The exception class of a code; UnknownError for codes outside 1-16."""
    return _BY_CODE.get(code, UnknownError)


def register_reason(cls):
    """Registers cls, a subclass of its code's class with a ``reason``, so
    that errors arriving with that code and reason are raised as cls. Use
    it as a class decorator."""
    base = error_class(cls.code)
    if not issubclass(cls, base) or not cls.reason:
        raise TypeError(f"{cls.__name__} must subclass {base.__name__} and set a reason")
    have = _BY_REASON.get(cls.reason)
    if have is not None and have is not cls:
        raise ValueError(f"reason {cls.reason!r} is registered to {have.__name__}")
    _BY_REASON[cls.reason] = cls
    return cls


def from_wire(code, message, reason=""):
    """The exception for an error that arrived with code, message and
    reason: the registered class of (code, reason) if there is one, else
    the code's class (reason kept)."""
    cls = _BY_REASON.get(reason) if reason else None
    if cls is None or cls.code != code:
        cls = error_class(code)
        return cls(message, reason=reason, code=code)
    return cls(message)
