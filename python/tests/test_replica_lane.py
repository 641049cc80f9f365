"""A Python replica's lane (docs/protocol.md, "serve.replica lanes"): by
reference its batches and answers go as fixed frames through two FIFOs in
its folder instead of msgpack messages on its stream, against a real Go
node: taken by default, left with lane=False or by bytes, made anew for
each attachment (a replica detached and attached again reads nothing of the
last one), woken by close(); the kill -9 cases are test_replica.py's, run
with and without it."""

import os
import stat
import threading
import time
import unittest

import numpy as np

from tensorwire import replica as replica_module, serve

from nodes import wait_until
from test_replica import AttachedNodeCase, mlp, obs, stats

try:
    import torch
except ImportError:  # the suite's other interpreter has torch; this test needs it
    torch = None


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaLane(AttachedNodeCase, unittest.TestCase):
    def predict_right(self, module, n=5, seed=3):
        x = obs(n, seed=seed)
        out = self.client().predict({"obs": x}, timeout=60)["logits"]
        with torch.inference_mode():
            np.testing.assert_array_equal(out, module(torch.from_numpy(x)).numpy())

    def test_taken_by_default(self):
        module = mlp(1)
        r = self.replica(module)
        wait_until(lambda: r.lane, what="the node took the lane")
        for fifo in ("batches", "answers"):
            self.assertTrue(stat.S_ISFIFO(os.stat(os.path.join(r._dir, fifo)).st_mode), fifo)
        for i in range(20):
            self.predict_right(module, n=1 + i % 16, seed=i)
        self.assertEqual(r.batches, 20)
        self.assertEqual(r.attachments, 1)

    def test_window_of_two(self):
        module = mlp(2)
        r = self.replica(module, window=2)
        wait_until(lambda: r.lane, what="the node took the lane")
        c = self.client()
        xs = [obs(1 + i % 5, seed=i) for i in range(24)]
        futs = [c.predict_async({"obs": x}, timeout=60) for x in xs]
        with torch.inference_mode():
            for x, f in zip(xs, futs):
                # Batched with other requests' rows: equal to the module on
                # its own rows up to the last bits (the kernels block by batch).
                np.testing.assert_allclose(f.result(60)["logits"], module(torch.from_numpy(x)).numpy(),
                                           rtol=1e-5, atol=1e-6)

    def test_left_on_the_stream(self):
        for kw in ({"lane": False}, {"mode": "bytes"}):
            with self.subTest(**kw):
                module = mlp(3)
                r = self.replica(module, **kw)
                wait_until(lambda: stats(self.node).get("attached_now", 0) == 1, what="the replica attached")
                self.predict_right(module)
                self.assertFalse(r.lane)
                r.close()
                wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica left")

    def test_not_taken(self):
        """A lane the node cannot open (here its files are not FIFOs, as on
        a filesystem without them): the node sends the batches on the
        stream, as a node from before lanes does, and the replica serves
        them there."""
        def not_a_fifo(path, mode=0o600):
            open(path, "w").close()

        real = replica_module.os.mkfifo
        replica_module.os.mkfifo = not_a_fifo
        self.addCleanup(setattr, replica_module.os, "mkfifo", real)
        module = mlp(6)
        r = self.replica(module)
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 1, what="the replica attached")
        self.predict_right(module)
        self.predict_right(module, n=9, seed=4)
        self.assertFalse(r.lane)
        self.assertEqual(r.batches, 2)
        replica_module.os.mkfifo = real
        r.close()
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica left")

    def test_attached_again_reads_nothing_old(self):
        """A module that fails a batch gets the replica detached; it attaches
        again with fresh FIFOs, and the next batches are answered right."""
        module = mlp(4)
        fail = threading.Event()
        fail.set()

        class Once(torch.nn.Module):
            def forward(self, x):
                if fail.is_set():
                    fail.clear()
                    raise ValueError("boom once")
                return module(x)

        r = self.replica(Once())
        wait_until(lambda: r.lane, what="the node took the lane")
        with self.assertRaisesRegex(serve.ForwardError, "boom once"):
            self.client().predict({"obs": obs(2)}, timeout=60)
        wait_until(lambda: r.attachments == 2 and stats(self.node).get("attached_now", 0) == 1,
                   what="the replica attached again")
        for i in range(5):
            self.predict_right(module, n=2 + i, seed=10 + i)
        self.assertTrue(r.lane)

    def test_close_ends_the_lane(self):
        """close() returns at once though no batch comes (the node closes
        the lane when the stream is cancelled), and the node sees the
        replica leave."""
        r = self.replica(mlp(5))
        wait_until(lambda: r.lane, what="the node took the lane")
        t0 = time.monotonic()
        r.close()
        self.assertLess(time.monotonic() - t0, 5)
        self.assertFalse(r._thread.is_alive())
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica left")


if __name__ == "__main__":
    unittest.main()
