"""LZ4-compressed bodies (docs/protocol.md, "Compression"), read when the
lz4 package is there (PyPI's lz4, Debian's python3-lz4).

A node compresses a body when a sample of it pays, unless the request
says `uncompressed`. This client leaves that unset only when made with
rpc.Client(compression=True), which needs the lz4 package; by default it
asks for uncompressed bodies, as it always did. Such a client compresses
the bodies it sends the same way (seal), which every version 2 node reads.
"""

try:
    import lz4.block as _block
    import lz4.frame as _frame
except ImportError:  # optional: without it, bodies go uncompressed
    _block = _frame = None

# What Go's sender does (rpc/compress.go): a body of MIN_BODY bytes or more
# is compressed when its first SAMPLE bytes (a 64th of a body under 4 MiB,
# MIN_SAMPLE at least) compressed as one block shrink below PAYS of their
# size, into a frame of independent 256 KiB blocks without checksums.
SAMPLE = 64 << 10
MIN_SAMPLE = 1 << 10
MIN_BODY = 1 << 10
PAYS = 0.9


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
    of raw in order (the caller checked that the TensorDicts need as many)."""
    src = memoryview(raw)
    pos = 0

    def fill(mv):
        nonlocal pos
        n = mv.nbytes
        mv.cast("B")[:] = src[pos:pos + n]
        pos += n

    return fill


def seal(parts, raw):
    """The LZ4 frame of a body of raw bytes made of parts (bytes-like, in
    order), or None when it is too small or a sample of it does not
    compress below PAYS (it then goes as it is), as Go's sender decides."""
    if raw < MIN_BODY:
        return None
    n = min(raw, SAMPLE, max(raw // 64, MIN_SAMPLE))
    sample = bytearray()
    for p in parts:
        mv = memoryview(p).cast("B")
        sample += mv[:n - len(sample)]
        if len(sample) >= n:
            break
    z = _block.compress(bytes(sample), store_size=False)
    if len(z) >= PAYS * len(sample):
        return None
    c = _frame.LZ4FrameCompressor(block_size=_frame.BLOCKSIZE_MAX256KB, block_linked=False,
                                  content_checksum=False, block_checksum=False)
    out = [c.begin()]
    for p in parts:
        out.append(c.compress(memoryview(p).cast("B")))
    out.append(c.flush())
    return b"".join(out)
