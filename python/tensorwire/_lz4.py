"""LZ4-compressed bodies (docs/protocol.md, "Compression"), read when the
lz4 package is there (PyPI's lz4, Debian's python3-lz4).

A node compresses a body when a sample of it pays, unless the request
says `uncompressed`. This client leaves that unset only when made with
rpc.Client(compression=True), which needs the lz4 package; by default it
asks for uncompressed bodies, as it always did.
"""

try:
    import lz4.frame as _frame
except ImportError:  # optional: without it, bodies come uncompressed
    _frame = None


def available():
    """Whether LZ4 frames can be decoded here."""
    return _frame is not None


class FrameError(ValueError):
    """A body that is not one LZ4 frame of exactly the header's raw_len
    bytes: corrupt, ending short, inflating past it, or followed by other
    bytes."""


def decompress(frame, raw_len):
    """The raw_len bytes of the LZ4 frame frame (bytes-like), or FrameError.
    Never inflates past raw_len + 1 bytes, whatever the frame says."""
    d = _frame.LZ4FrameDecompressor()
    try:
        out = d.decompress(frame, max_length=raw_len + 1)
    except RuntimeError as e:  # python-lz4's error for a frame it cannot read
        raise FrameError(f"lz4: {e}") from None
    if len(out) > raw_len:
        raise FrameError(f"the LZ4 frame inflates past its raw_len of {raw_len} bytes")
    if len(out) < raw_len or not d.eof:
        raise FrameError(f"the LZ4 frame ends short of its raw_len of {raw_len} bytes ({len(out)})")
    if d.unused_data:
        raise FrameError(f"{len(d.unused_data)} bytes follow the LZ4 frame in the body")
    return out


def filler(raw):
    """A read_into function (as _td.build takes) that hands out the bytes
    of raw in order."""
    src = memoryview(raw)
    pos = 0

    def fill(mv):
        nonlocal pos
        n = mv.nbytes
        if pos + n > len(src):
            raise FrameError(f"the body's {len(src)} bytes end before its TensorDicts' {pos + n}")
        mv.cast("B")[:] = src[pos:pos + n]
        pos += n

    return fill
