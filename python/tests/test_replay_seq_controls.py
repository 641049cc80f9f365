"""Reverb's table controls from Python against a real Go node: the LIFO and
heap samplers, max-times-sampled, the SampleToInsertRatio limiter and the
top-k writer as `tensorwire node --buffer` settings, delete and reset, in
both modes; and replay.delete's and replay.reset's golden bytes
(replay/testdata/wire/controls.hex, which replay's Go tests pin too)."""

import os
import threading
import time
import unittest

import numpy as np

from tensorwire import _msgpack, errors, replay

from nodes import REPO, Node
from test_golden_services import parse
from test_replay import MODES, batch_of, check_rows, dial


class TestControls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        bufs = []
        for mode in MODES:
            bufs += [
                f"lifo-{mode},capacity=16,sampler=lifo",
                f"max-{mode},capacity=16,sampler=max_heap",
                f"stack-{mode},capacity=16,sampler=lifo,max-times-sampled=1",
                f"twice-{mode},capacity=16,max-times-sampled=2",
                f"ratio-{mode},capacity=64,samples-per-insert=2,error-buffer=4,min-size=2",
                f"topk-{mode},capacity=4,writer=top_k,key=next/reward",
                f"del-{mode},capacity=8,sampler=fifo",
            ]
        cls.node = Node(buffers=bufs).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def test_lifo_and_max_heap(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"lifo-{mode}", mode) as b:
                b.extend(batch_of([1, 2, 3, 4]))
                for _ in range(2):  # left in
                    td, _ = b.sample(3)
                    check_rows(self, td)
                    np.testing.assert_array_equal(td["action"], [4, 3, 2])
            with self.subTest(mode=mode), dial(self.node, f"max-{mode}", mode) as b:
                b.extend(batch_of([1, 2, 3, 4]), priorities=[0.5, 3.0, 1.0, 2.0])
                td, info = b.sample(2)
                np.testing.assert_array_equal(td["action"], [2, 4])
                b.update_priority(replay.SampleInfo([0], [1], [1.0]), [9.0])
                td, _ = b.sample(1)
                np.testing.assert_array_equal(td["action"], [1])

    def test_max_times_sampled(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"stack-{mode}", mode) as b:
                b.extend(batch_of([1, 2, 3]))
                td, _ = b.sample(3)  # a stack: newest first, each once
                np.testing.assert_array_equal(td["action"], [3, 2, 1])
                with self.assertRaises(errors.DeadlineExceededError):
                    b.sample(1, timeout=0.2)
                self.assertEqual(b.stats()["size"], 0)
            with self.subTest(mode=mode), dial(self.node, f"twice-{mode}", mode) as b:
                b.extend(batch_of(range(1, 6)))
                td, _ = b.sample(10)
                check_rows(self, td)
                ids, counts = np.unique(td["action"], return_counts=True)
                np.testing.assert_array_equal(ids, [1, 2, 3, 4, 5])
                np.testing.assert_array_equal(counts, [2] * 5)

    def test_samples_per_insert(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"ratio-{mode}", mode) as b:
                b.extend(batch_of([1, 2]))
                # diff = 2*inserts - samples stays at or above 2*2 - 4 = 0:
                # after 2 inserts, 4 samples are allowed, not a fifth.
                td, _ = b.sample(4, timeout=10)
                check_rows(self, td)
                with self.assertRaises(errors.DeadlineExceededError):
                    b.sample(1, timeout=0.2)
                got = []
                t = threading.Thread(target=lambda: got.append(b.sample(2, timeout=10)[0]))
                t.start()
                time.sleep(0.1)
                self.assertEqual(got, [])  # waiting for an insert
                b.extend(batch_of([3]), timeout=10)  # two more samples' worth
                t.join(10)
                self.assertEqual(len(got), 1)
                st = b.stats()
                self.assertEqual((st["inserted"], st["sampled"]), (3, 6))

    def test_top_k_writer(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"topk-{mode}", mode) as b:
                b.extend(batch_of([5, 1, 7, 3]))
                idx = b.extend(batch_of([2, 9, 6]))  # 2 is below the four kept
                self.assertEqual(idx[0], -1)
                td, _ = b.sample(64)
                self.assertEqual(set(td["action"].tolist()), {5, 7, 9, 6})

    def test_delete_and_reset(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, f"del-{mode}", mode) as b:
                idx = b.extend(batch_of([1, 2, 3, 4, 5]))
                td, info = b.sample(1)  # 1, consumed by the queue
                np.testing.assert_array_equal(td["action"], [1])
                self.assertEqual(b.delete(info), 0)  # out already
                self.assertEqual(b.delete([idx[1], idx[3]]), 2)
                td, _ = b.sample(2)
                np.testing.assert_array_equal(td["action"], [3, 5])
                with self.assertRaises(replay.SchemaError):
                    b.delete([8])
                b.extend(batch_of([6, 7]))
                b.reset()
                st = b.stats()
                self.assertEqual((st["size"], st["inserted"], st["sampled"]), (0, 0, 0))
                with self.assertRaises(errors.DeadlineExceededError):
                    b.sample(1, timeout=0.2)
                b.extend(batch_of([8]))
                td, _ = b.sample(1)
                np.testing.assert_array_equal(td["action"], [8])


class TestControlsGolden(unittest.TestCase):
    """This client writes replay.delete's and replay.reset's requests as
    Go does, and reads their responses."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(REPO, "replay", "testdata", "wire", "controls.hex")) as f:
            cls.g = parse(f.read())[1]

    def test_delete(self):
        info = replay.SampleInfo([3, 5], [7, 9], [0.5, 1.0])
        self.assertEqual(_msgpack.packb(replay._delete_request("buf", info)), self.g["replay.delete request"])
        self.assertEqual(_msgpack.packb(replay._delete_request("buf", [3])), self.g["replay.delete request, by index"])
        self.assertEqual(_msgpack.unpackb(self.g["replay.delete response"]), {"deleted": 1})
        with self.assertRaises(replay.SchemaError):
            replay._delete_request("buf", [3, 8], capacity=8)

    def test_reset(self):
        self.assertEqual(_msgpack.packb({"name": "buf"}), self.g["replay.reset request"])
        self.assertEqual(_msgpack.unpackb(self.g["replay.reset response"]), {})


if __name__ == "__main__":
    unittest.main()
