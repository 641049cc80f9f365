"""Outputs that stay where the sidecar wrote them (docs/collective.md,
"Outputs in the data file").

A collective done in place (Allreduce, Reduce, Bcast, and the Wait of an
Irecv) leaves its output where its input was, in the file this process
and its sidecar both map. Copying it out into the process's own memory
costs a pass over the tensor each call, twice a training step (forward
and backward). Instead, a large input goes to a *region* of the file that
no live tensor uses, and the output comes back as an array over that
region: no copy. The region is the output's until nothing refers to it
any more; only then does a later call write there.

"Nothing refers to it" is the region's reference count, by the rule the
output pool uses (_outpool.unreferenced): a region is an object exposing its bytes through
``__array_interface__``, so every numpy array over it (and every view,
reshape and dtype view of those) has it as its base, torch.from_numpy
keeps the array in the tensor's storage (and its views share that
storage), and while any of them lives its count is above the table's own.

The file's layout: regions at offsets that are multiples of 4096, in any
order, and after the last live one the *scratch*, where a call whose
output is copied out (small tensors, the other collectives) puts its
input and finds its output. A region whose tensors are gone is a hole a
later region may take. Bounded: at most MAX_REGIONS regions live and the
file's regions within MAX_BYTES; past that a call uses the scratch and
copies its output out, as before.

A region lives in a MAP_SHARED mapping: a process forked while it lives
(a DataLoader worker, say) shares its pages with this one, where an
output copied out would have been copy-on-write.
"""

import ctypes

from ._outpool import COUNTED, unreferenced

# Outputs below this size are copied out of the scratch: the copy is cheap
# and the 1 KB path stays as it was.
MIN_BYTES = 64 << 10
MAX_REGIONS = 8
MAX_BYTES = 1 << 30
ALIGN = 4096


class Region:
    """A live output's bytes in the data file: numpy's base for every array
    over them. It keeps the mapping it points into alive."""

    __slots__ = ("__array_interface__", "_mapping", "off", "end")

    def __init__(self, mapping, ptr, off, nbytes):
        self._mapping = mapping  # the mmap whose pages ptr points into
        self.off, self.end = off, off + nbytes
        self.__array_interface__ = {"data": (ptr + off, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


def address(mm):
    """The address of mmap mm's first byte."""
    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # its export would keep mm from closing


def align(n, a):
    """n rounded up to a multiple of a."""
    return (n + a - 1) // a * a


class Regions:
    """The data file's table of regions. Not safe for concurrent use: the
    sidecar's lock guards it."""

    def __init__(self, min_bytes=MIN_BYTES, max_regions=MAX_REGIONS, max_bytes=MAX_BYTES):
        self.min_bytes, self.max_regions, self.max_bytes = min_bytes, max_regions, max_bytes
        self._live = []  # Regions some array may still use, by offset

    def _prune(self):
        live = self._live
        self._live = [live[i] for i in range(len(live)) if not unreferenced(live, i)]

    def place(self, nbytes):
        """Where an input of nbytes goes so that its output stays: the
        offset of a hole no live region overlaps, or None (too small, an
        interpreter without reference counts, or the bounds reached): then
        the scratch, at scratch()."""
        if nbytes < self.min_bytes or not COUNTED:
            return None
        self._prune()
        if len(self._live) >= self.max_regions:
            return None
        need = align(nbytes, ALIGN)
        at = 0
        for r in self._live:  # first fit, in offset order
            if r.off - at >= need:
                break
            at = max(at, align(r.end, ALIGN))
        if at + need > self.max_bytes:
            return None
        return at

    def claim(self, mapping, ptr, off, nbytes):
        """The Region of nbytes at off (a hole place gave), over mapping
        (whose first byte is at address ptr), now live."""
        r = Region(mapping, ptr, off, nbytes)
        live = self._live
        i = 0
        while i < len(live) and live[i].off < off:
            i += 1
        live.insert(i, r)
        return r

    def find(self, ptr, nbytes):
        """The file offset of the nbytes at address ptr when they lie within
        one live region (an output kept, or a tensor of alloc), else None."""
        for r in self._live:
            base = r.__array_interface__["data"][0]
            if base <= ptr and ptr + nbytes <= base + (r.end - r.off):
                return r.off + (ptr - base)
        return None

    def scratch(self):
        """Where the scratch starts: after every live region, 64-byte
        aligned."""
        self._prune()
        return max((align(r.end, 64) for r in self._live), default=0)

    def stats(self):
        """(regions, bytes) live now."""
        self._prune()
        return len(self._live), sum(r.end - r.off for r in self._live)
