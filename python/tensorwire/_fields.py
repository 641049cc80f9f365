"""Checks of what a node answers, shared by the clients: a field that is
not what the protocol says is the node's fault, InternalError naming it
(docs/reliability.md, "The Python client's decoders")."""

from .errors import InternalError


def is_int(v):
    """Whether v is an integer, as msgpack decodes one (not a bool, which
    Python counts as an int)."""
    return isinstance(v, int) and not isinstance(v, bool)


def uint(r, key, what, default=None):
    """Field key of the node's answer r (a dict): an integer of 0 or more;
    default when the field is absent or nil, if one is given. Anything
    else is InternalError, its message starting with what ("store")."""
    v = r.get(key)
    if v is None:
        v = default
    if not is_int(v) or v < 0:
        raise InternalError(f"{what}: the node's answer has {key} {v!r:.100}")
    return v


def answer(r, what, method):
    """The node's answer r to method, which every service method gives as a
    map; InternalError, starting with what ("store"), otherwise."""
    if not isinstance(r, dict):
        raise InternalError(f"{what}: the node answered {method} with {r!r:.200}")
    return r
