"""The data file's regions (tensorwire/_regions.py): a region is placed
only where no live output is, whatever was made of the outputs there; a
dropped output's place is taken again; the table stays within its bounds.
Real ranks: test_collective.py, TestCollectivePool."""

import gc
import mmap
import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tensorwire._regions import ALIGN, Regions, address  # noqa: E402

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

NB = 1 << 17


class File:
    """A mapping standing in for the data file, and what collective.py does
    with a region: place, write, claim, view."""

    def __init__(self, size=16 << 20, **bounds):
        self.mm = mmap.mmap(-1, size)
        self.ptr = address(self.mm)
        self.u8 = np.frombuffer(self.mm, np.uint8)
        self.regions = Regions(**bounds)

    def output(self, v, nbytes=NB):
        """A float64 output of nbytes filled with v, in a region, or None
        where place gives none."""
        at = self.regions.place(nbytes)
        if at is None:
            return None
        self.u8[at:at + nbytes].view(np.float64)[:] = v  # the sidecar's write
        r = self.regions.claim(self.mm, self.ptr, at, nbytes)
        return np.asarray(r).view(np.float64).reshape(2, -1)


class TestRegions(unittest.TestCase):
    def test_output_is_the_file(self):
        f = File()
        a = f.output(3)
        at = a.ctypes.data - f.ptr
        self.assertTrue(0 <= at < len(f.mm) and at % ALIGN == 0, at)
        f.u8[at:at + 8].view(np.float64)[0] = 9  # no copy: the file's bytes are the array's
        self.assertEqual(a[0, 0], 9)

    def test_taken_again_once_dropped(self):
        f = File()
        a = f.output(1)
        first = a.ctypes.data
        b = f.output(2)
        self.assertNotEqual(b.ctypes.data, first, "placed over a live output")
        del a
        c = f.output(3)
        self.assertEqual(c.ctypes.data, first, "a dropped output's place not taken again")
        self.assertTrue((b == 2).all() and (c == 3).all())
        self.assertEqual(f.regions.stats(), (2, 2 * NB))

    def _held(self, make):
        """make(output) -> what a user keeps; it must keep its values while
        later outputs are made and dropped."""
        f = File()
        kept = make(f.output(7))
        for i in range(20):
            f.output(i)
        got = kept.numpy() if HAVE_TORCH and isinstance(kept, torch.Tensor) else np.asarray(kept)
        self.assertTrue((got == 7).all(), got.ravel()[:4])
        self.assertEqual(f.regions.stats()[0], 1)

    def test_held_array(self):
        self._held(lambda a: a)

    def test_held_views(self):
        self._held(lambda a: a[1])
        self._held(lambda a: a.reshape(-1)[3:9])
        self._held(lambda a: a.view(np.int64).view(np.float64).T)
        self._held(lambda a: memoryview(a))

    @unittest.skipUnless(HAVE_TORCH, "needs torch")
    def test_held_tensors(self):
        self._held(lambda a: torch.from_numpy(a))
        self._held(lambda a: torch.from_numpy(a)[1, 2:5])
        self._held(lambda a: torch.from_numpy(a).view(torch.int64).view(torch.float64))
        self._held(lambda a: torch.from_numpy(a).numpy()[1:])

    def test_outlives_the_file(self):
        """An output stays readable after the communicator lets go of the
        mapping (close drops it): the region keeps the mapping alive."""
        f = File()
        a = f.output(4)
        del f
        gc.collect()
        self.assertTrue((a == 4).all())
        a[:] = 5  # still writable, still mapped
        self.assertTrue((a == 5).all())

    def test_first_fit_between_live_ones(self):
        f = File()
        outs = [f.output(i) for i in range(4)]
        offs = [o.ctypes.data - f.ptr for o in outs]
        self.assertEqual(offs, [i * NB for i in range(4)])
        del outs[1]  # a hole of NB at NB
        small = f.output(5, NB // 2)
        self.assertEqual(small.ctypes.data - f.ptr, NB, "not placed in the first hole")
        big = f.output(6, 2 * NB)
        self.assertEqual(big.ctypes.data - f.ptr, 4 * NB, "placed over a live output")
        self.assertEqual(f.regions.scratch(), 6 * NB)
        del big
        self.assertEqual(f.regions.scratch(), 4 * NB)

    def test_bounds(self):
        f = File(max_regions=3, max_bytes=4 * NB)
        outs = [f.output(i) for i in range(3)]
        self.assertIsNone(f.regions.place(NB), "more than max_regions live")
        del outs[0]
        self.assertIsNotNone(f.regions.place(NB))
        self.assertIsNone(f.regions.place(3 * NB), "past max_bytes")
        self.assertIsNone(f.regions.place(1024), "a small output placed (it is copied)")


if __name__ == "__main__":
    unittest.main()
