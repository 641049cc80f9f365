"""The host buffers that collective outputs are copied into, reused
(docs/collective.md, "Outputs without a fresh allocation").

A large output copied into a new numpy array pays, besides the copy, a
page fault for every page of the new memory on its first touch (an
allocation of 128 KiB or more is a fresh mapping of the allocator's); on
a virtual machine that costs several times the copy itself. A loop of
calls of one size makes and drops such an array every call. The pool
keeps the few most recent large buffers and gives one out again once
nothing uses it any more.

"Nothing uses it" is the buffer's reference count: every array made from
a buffer (a view, a reshape, a dtype view, a slice of any of these) has
the buffer as its base, torch.from_numpy keeps the array it was given in
the tensor's storage (views of the tensor share that storage, and
``.numpy()`` of it refers to the tensor), and a memoryview keeps its
exporter: while any of them lives, the buffer's count is above the pool's
own references, and the buffer is not given out.
"""

import sys
import threading

import numpy as np

# Outputs below this size are plain new arrays: the allocator serves them
# from memory it has touched already, and the 1 KB path stays as it was.
MIN_BYTES = 64 << 10
# At most this many buffers and bytes are the pool's (in use or not); a
# buffer over half the bytes is not pooled.
MAX_BUFS = 4
MAX_BYTES = 1 << 30


def _refs(items, i):
    return sys.getrefcount(items[i])


def _calibrate():
    if not hasattr(sys, "getrefcount"):  # an interpreter without reference counts: no pool
        return None
    items = [np.empty(1, np.uint8)]
    return _refs(items, 0)


# The count of an object only its list refers to, as _refs sees it (the
# same call, so the interpreter's own references on its stack are the
# same too).
_FREE = _calibrate()

# Whether this interpreter counts references (no pool, no regions without).
COUNTED = _FREE is not None


def unreferenced(items, i):
    """Whether nothing but the list items refers to items[i] (COUNTED
    interpreters only): the rule of the pool here and of the data file's
    regions (_regions.py)."""
    return _refs(items, i) <= _FREE


class OutputPool:
    """Buffers for outputs, reused by size once unreferenced. Safe for
    concurrent use; bounded by max_bufs and max_bytes (the buffers it
    keeps, whether in use or not: one dropped from the pool while in use
    lives on with its arrays and is freed with them)."""

    def __init__(self, min_bytes=MIN_BYTES, max_bufs=MAX_BUFS, max_bytes=MAX_BYTES):
        self.min_bytes, self.max_bufs, self.max_bytes = min_bytes, max_bufs, max_bytes
        self._bufs = []  # least recently given out first
        self._bytes = 0
        self.made = 0  # buffers made for the pool so far
        self._lock = threading.Lock()

    def take(self, nbytes):
        """A uint8 array of nbytes that no other array, tensor or view
        refers to: the caller may overwrite it. Its contents are
        undefined."""
        if nbytes < self.min_bytes or 2 * nbytes > self.max_bytes or not COUNTED:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            bufs = self._bufs
            for i in range(len(bufs) - 1, -1, -1):
                if bufs[i].nbytes == nbytes and unreferenced(bufs, i):
                    b = bufs.pop(i)
                    bufs.append(b)
                    return b
            b = np.empty(nbytes, np.uint8)
            self.made += 1
            bufs.append(b)
            self._bytes += nbytes
            while len(bufs) > self.max_bufs or self._bytes > self.max_bytes:
                self._bytes -= bufs.pop(0).nbytes
            return b

    def stats(self):
        """(buffers, bytes) the pool holds now."""
        with self._lock:
            return len(self._bufs), self._bytes
