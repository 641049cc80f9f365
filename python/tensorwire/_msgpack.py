"""msgpack as tensorwire's peers write it (docs/protocol.md, "Messages").

Encoding is done here rather than by the msgpack package, whose integers
take their smallest *unsigned* form (1000 is cd 03e8) where Go's peers write
the smallest *signed* one (d1 03e8), and whose maps keep insertion order
where Go's sort their keys. Writing the same bytes as Go lets the golden
tests of rpc/golden_test.go be checked from Python too; readers accept any
valid encoding either way. Decoding uses the msgpack package.
"""

import struct

import msgpack
import numpy as np

_pack_b = struct.Struct(">b").pack
_pack_h = struct.Struct(">h").pack
_pack_i = struct.Struct(">i").pack
_pack_q = struct.Struct(">q").pack
_pack_Q = struct.Struct(">Q").pack
_pack_d = struct.Struct(">d").pack
_pack_H = struct.Struct(">H").pack
_pack_I = struct.Struct(">I").pack


def pack_int(v):
    """v as go-msgpack writes a Go integer: a fixint when it fits, else the
    smallest signed type (uint64 only above the int64 range)."""
    if -32 <= v <= 127:
        return _pack_b(v) if v < 0 else bytes((v,))
    if -128 <= v <= 127:
        return b"\xd0" + _pack_b(v)
    if -(1 << 15) <= v < (1 << 15):
        return b"\xd1" + _pack_h(v)
    if -(1 << 31) <= v < (1 << 31):
        return b"\xd2" + _pack_i(v)
    if -(1 << 63) <= v < (1 << 63):
        return b"\xd3" + _pack_q(v)
    if v < (1 << 64):
        return b"\xcf" + _pack_Q(v)
    raise OverflowError(f"integer {v} does not fit in 64 bits")


def pack_str(s):
    b = s.encode("utf-8")
    n = len(b)
    if n < 32:
        return bytes((0xA0 | n,)) + b
    if n <= 0xFF:
        return b"\xd9" + bytes((n,)) + b
    if n <= 0xFFFF:
        return b"\xda" + _pack_H(n) + b
    return b"\xdb" + _pack_I(n) + b


def _pack_bin(b):
    n = len(b)
    if n <= 0xFF:
        return b"\xc4" + bytes((n,)) + b
    if n <= 0xFFFF:
        return b"\xc5" + _pack_H(n) + b
    return b"\xc6" + _pack_I(n) + b


def _array_header(n):
    if n < 16:
        return bytes((0x90 | n,))
    if n <= 0xFFFF:
        return b"\xdc" + _pack_H(n)
    return b"\xdd" + _pack_I(n)


def _map_header(n):
    if n < 16:
        return bytes((0x80 | n,))
    if n <= 0xFFFF:
        return b"\xde" + _pack_H(n)
    return b"\xdf" + _pack_I(n)


# Arrays of this many numbers or more are encoded with numpy, at a fixed
# width (int64 as d3, float64 as cb): any valid encoding is read back.
_VECTOR_MIN = 32


def _pack_vector(a):
    """A 1-D numpy array of integers or floats as a msgpack array."""
    n = a.shape[0]
    if a.dtype.kind == "f":
        rec = np.empty(n, dtype=[("m", "u1"), ("v", ">f8")])
        rec["m"] = 0xCB
        rec["v"] = a
        return _array_header(n) + rec.tobytes()
    if a.dtype.kind == "b":
        return _array_header(n) + np.where(a, 0xC3, 0xC2).astype("u1").tobytes()
    if n and a.min() >= 0 and a.max() <= 127:
        return _array_header(n) + a.astype("u1").tobytes()
    if a.dtype == np.uint64 and n and a.max() >= (1 << 63):
        rec = np.empty(n, dtype=[("m", "u1"), ("v", ">u8")])
        rec["m"] = 0xCF
    else:
        rec = np.empty(n, dtype=[("m", "u1"), ("v", ">i8")])
        rec["m"] = 0xD3
    rec["v"] = a
    return _array_header(n) + rec.tobytes()


def packb(v):
    """Encodes v: None, bool, int, float, str, bytes, lists and tuples,
    dicts with str keys (sorted, as Go writes struct fields), numpy scalars
    and 1-D numpy arrays of numbers."""
    out = []
    _pack_into(v, out)
    return b"".join(out)


def _pack_into(v, out):
    if v is None:
        out.append(b"\xc0")
    elif v is True:
        out.append(b"\xc3")
    elif v is False:
        out.append(b"\xc2")
    elif isinstance(v, int):
        out.append(pack_int(v))
    elif isinstance(v, float):
        out.append(b"\xcb" + _pack_d(v))
    elif isinstance(v, str):
        out.append(pack_str(v))
    elif isinstance(v, (bytes, bytearray, memoryview)):
        out.append(_pack_bin(bytes(v)))
    elif isinstance(v, dict):
        out.append(_map_header(len(v)))
        for k in sorted(v):
            if not isinstance(k, str):
                raise TypeError(f"msgpack map key {k!r}: want str")
            out.append(pack_str(k))
            _pack_into(v[k], out)
    elif isinstance(v, np.ndarray):
        if v.ndim != 1 or v.dtype.kind not in "biuf":
            raise TypeError(f"cannot encode a numpy array of shape {v.shape} and dtype {v.dtype}")
        if v.shape[0] >= _VECTOR_MIN:
            out.append(_pack_vector(v))
        else:
            _pack_into(v.tolist(), out)
    elif isinstance(v, (list, tuple)):
        out.append(_array_header(len(v)))
        for x in v:
            _pack_into(x, out)
    elif isinstance(v, np.generic):
        _pack_into(v.item(), out)
    else:
        raise TypeError(f"cannot encode {type(v).__name__} as msgpack")


class DecodeError(ValueError):
    """Bytes that are not exactly one msgpack value: malformed, cut short,
    followed by more bytes, nested too deep, invalid UTF-8 in a str, or a
    map key that cannot be a dict key (a map or a list)."""


def unpackb(b):
    """Decodes exactly one msgpack value: str as str, bin as bytes, maps as
    dicts. Anything else is DecodeError, whatever the msgpack package
    raised (its errors have no common base: an unhashable key is its
    TypeError)."""
    try:
        return msgpack.unpackb(b, raw=False, strict_map_key=False, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise DecodeError(f"msgpack: {e}") from None
