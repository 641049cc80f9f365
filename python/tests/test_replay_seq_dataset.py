"""The replay IterableDataset's prefetch against a real Go node: never
more than `prefetch` samples taken ahead of the consumer (the node's own
count of sampled rows says so), batches and slices; the thread is gone once
the iteration stops, even while it waited for a starved buffer; a buffer
the dataset made is closed with it, one the caller gave is left usable; a
closed buffer ends the iteration; a sample's error reaches the consumer."""

import threading
import time
import unittest

import numpy as np

from tensorwire import replay
from tensorwire.replay_seq import ReplayDataset

from nodes import TOKEN, Node
from test_replay import MODES, dial
from test_replay_seq_slices import check_slices, steps

try:
    import torch
except ImportError:
    torch = None

THREAD = "tensorwire-replay-prefetch"


def prefetch_threads():
    return [t for t in threading.enumerate() if t.name == THREAD and t.is_alive()]


def rows(n, first=0):
    ids = np.arange(first, first + n, dtype=np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, axis=1)}


@unittest.skipIf(torch is None, "torch is not installed")
class TestPrefetch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node(buffers=[f"pf-{m},capacity=1000" for m in MODES] +
                        [f"pfs-{m},capacity=1000,traj-key=episode" for m in MODES] +
                        ["starve,capacity=64,max-times-sampled=1", "plain,capacity=10"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def assert_bounded(self, b, it, consumed, prefetch, per_item, check):
        """Takes items from it, checking after each that the node has
        served at most (taken + prefetch) samples, then waits until the
        thread has fetched its prefetch (bounded by a hang guard) and checks
        the count stays there."""
        base = b.stats()["sampled"]
        for k in range(1, consumed + 1):
            check(next(it))
            self.assertLessEqual(b.stats()["sampled"] - base, (k + prefetch) * per_item)
        want = (consumed + prefetch) * per_item
        deadline = time.monotonic() + 60
        while b.stats()["sampled"] - base < want:
            self.assertLess(time.monotonic(), deadline, "the thread never fetched its prefetch")
            time.sleep(0.01)
        for _ in range(20):  # observations while the thread is blocked on its bound
            self.assertEqual(b.stats()["sampled"] - base, want)

    def test_batches_bounded(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"pf-{mode}", mode) as b:
                b.extend(rows(500))
                it = iter(b.as_dataset(16, prefetch=3))

                def check(item):
                    self.assertEqual(tuple(item["obs"].shape), (16, 3))
                    self.assertTrue(bool((item["obs"] == item["id"][:, None]).all()))

                self.assert_bounded(b, it, 2, 3, 16, check)
                it.close()
                self.assertEqual(prefetch_threads(), [])

    def test_slices_bounded(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"pfs-{mode}", mode) as b:
                for ep in range(6):
                    b.extend(steps(ep, 0, 30, 30))
                it = iter(b.as_dataset(32, slice_len=8, prefetch=2))

                def check(item):
                    arrays = {k: item[k].numpy() for k in ("obs", "episode", "step")}
                    check_slices(self, arrays, item["info"], 8)
                    self.assertEqual(tuple(item["mask"].shape), (32,))

                self.assert_bounded(b, it, 3, 2, 32, check)
                it.close()
                self.assertEqual(prefetch_threads(), [])

    def test_stop_while_starved(self):
        """The buffer runs dry (each row leaves after one sample) while the
        thread is fetching: it waits in the node, and closing the iterator
        still ends and joins it; the caller's buffer stays usable."""
        with dial(self.node, "starve", "ref") as b:
            b.extend(rows(32))
            it = iter(ReplayDataset(b, 8, prefetch=2))
            seen = [next(it) for _ in range(3)]  # the 4th is in hand; the 5th waits for rows
            deadline = time.monotonic() + 60
            while b.stats()["size"] > 0:  # the 4th taken: the thread now waits in the node
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.01)
            it.close()
            self.assertEqual(prefetch_threads(), [])
            ids = np.concatenate([s["id"].numpy() for s in seen])
            self.assertEqual(len(np.unique(ids)), 24)  # max_times_sampled=1: each row once
            b.extend(rows(8, 100))
            batch, _ = b.sample(8)
            self.assertTrue((batch["id"] >= 100).all())

    def test_owned_buffer_closed_with_iteration(self):
        made = []

        def source():
            made.append(dial(self.node, "pf-ref", "ref"))
            return made[-1]

        made_b = dial(self.node, "pf-ref", "ref")
        made_b.extend(rows(100))
        made_b.close()
        for i, item in enumerate(ReplayDataset(source, 8, prefetch=2)):
            if i == 3:
                break
        self.assertEqual(prefetch_threads(), [])
        with self.assertRaises(replay.ClosedError):
            made[0].sample(1)

    def test_closed_buffer_ends_iteration(self):
        b = dial(self.node, "pf-bytes", "bytes")
        b.extend(rows(100))
        it = iter(b.as_dataset(8, prefetch=2))
        next(it)
        b.close()
        done = []
        t = threading.Thread(target=lambda: done.append(sum(1 for _ in it)))
        t.start()
        t.join(60)  # a hang guard
        self.assertFalse(t.is_alive(), "the iteration over a closed buffer did not end")
        self.assertLessEqual(done[0], 2)  # what was fetched before the close
        self.assertEqual(prefetch_threads(), [])

    def test_error_reaches_consumer(self):
        with dial(self.node, "plain", "bytes") as b:
            b.extend(rows(4))
            with self.assertRaises(replay.ArgumentError):
                next(iter(b.as_dataset(4, slice_len=2)))
            self.assertEqual(prefetch_threads(), [])


if __name__ == "__main__":
    unittest.main()
