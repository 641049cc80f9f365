"""The output pool of tensorwire.collective (tensorwire/_outpool.py): a
buffer is given out again only once nothing refers to it, whatever was
made of it; the pool stays within its bounds. Real ranks:
test_collective.py, TestCollectivePool."""

import os
import sys
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tensorwire._outpool import OutputPool  # noqa: E402

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

NB = 1 << 17


def fill(pool, v):
    """An output as collective.py makes one: a float64 view of a buffer
    of the pool, filled with v."""
    a = pool.take(NB).view(np.float64).reshape(2, -1)
    a[:] = v
    return a


class TestOutputPool(unittest.TestCase):
    def test_reused_once_dropped(self):
        p = OutputPool()
        a = fill(p, 1)
        base = id(a.base)
        b = p.take(NB)
        self.assertNotEqual(id(b), base, "given out while referenced")
        del a
        self.assertEqual(id(p.take(NB)), base, "not given out again once dropped")
        self.assertEqual(p.made, 2)

    def _held(self, make):
        """make(output) -> what a user keeps; it must keep its values while
        later outputs of the same size are made and dropped."""
        p = OutputPool()
        kept = make(fill(p, 7))
        for i in range(20):
            fill(p, i)
        got = kept.numpy() if HAVE_TORCH and isinstance(kept, torch.Tensor) else np.asarray(kept)
        self.assertTrue((got == 7).all(), got.ravel()[:4])
        self.assertEqual(p.made, 2, "one buffer held, one reused by every later output")

    def test_held_array(self):
        self._held(lambda a: a)

    def test_held_views(self):
        self._held(lambda a: a[1])
        self._held(lambda a: a.reshape(-1)[3:9])
        self._held(lambda a: a.view(np.int64).view(np.float64).T)

    def test_held_memoryview(self):
        self._held(lambda a: memoryview(a))

    @unittest.skipUnless(HAVE_TORCH, "needs torch")
    def test_held_tensors(self):
        self._held(lambda a: torch.from_numpy(a))
        self._held(lambda a: torch.from_numpy(a)[1, 2:5])
        self._held(lambda a: torch.from_numpy(a).view(-1).numpy()[4:])
        self._held(lambda a: torch.from_numpy(a.view(np.int64)).view(torch.float64))

    def test_bounded_over_varying_sizes(self):
        p = OutputPool(max_bufs=3, max_bytes=16 * NB)
        kept = []
        for i in range(50):
            nb = NB + 4096 * (i % 7)
            b = p.take(nb)
            if i % 5 == 0:
                kept.append(b)  # some held: dropped from the pool, never reused
            bufs, nbytes = p.stats()
            self.assertLessEqual(bufs, 3)
            self.assertLessEqual(nbytes, 16 * NB)
        self.assertEqual(len({id(b) for b in kept}), len(kept))

    def test_small_and_huge_not_pooled(self):
        p = OutputPool(max_bytes=8 * NB)
        p.take(1024)
        p.take(5 * NB)
        self.assertEqual(p.stats(), (0, 0))


if __name__ == "__main__":
    unittest.main()
