"""A Python replica's window (docs/protocol.md, serve.replica): the node
keeps up to window batches in flight to it; by reference each has its own
rows in the replica's folder ("row"), and the outputs are the module's."""

import threading
import unittest

import numpy as np

from tensorwire import InvalidArgumentError, serve
from nodes import wait_until
from test_replica import AttachedNodeCase, mlp, obs, stats

try:
    import torch
except ImportError:
    torch = None


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaWindow(AttachedNodeCase, unittest.TestCase):
    def run_two(self, mode, window):
        """Two batches: the module holds the first until the node has taken
        the second (queued 0). Returns the rows the replica was told."""
        net = mlp(3)
        entered, release = threading.Event(), threading.Event()

        def module(x):
            if not entered.is_set():
                entered.set()
                release.wait(60)
            return net(x)

        r = self.replica(module, mode, start=False, window=window)
        self.assertEqual(r.mode, mode)
        rows = []
        run = r._run_batch

        def record(msg):
            rows.append(int(msg.get("row") or 0))
            return run(msg)

        r._run_batch = record
        r.start()
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 1, what="the replica attached")
        c = self.client(mode)
        x1, x2 = obs(3, seed=1), obs(5, seed=2)
        f1 = c.predict_async({"obs": x1}, timeout=60)
        wait_until(entered.is_set, what="the first forward started")
        f2 = c.predict_async({"obs": x2}, timeout=60)
        if window > 1:  # the replica's other lane takes it at once
            wait_until(lambda: stats(self.node)["queued"] == 0, what="the second batch taken")
        release.set()
        for f, x in ((f1, x1), (f2, x2)):
            with torch.inference_mode():
                want = net(torch.from_numpy(x)).numpy()
            np.testing.assert_array_equal(f.result(60)["logits"], want)
        r.close()
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica left")
        return rows

    def test_by_reference(self):
        """Window 2: the two batches in flight use the folder's two sets of
        rows, [0, 16) and [16, 32)."""
        self.assertEqual(sorted(self.run_two("ref", 2)), [0, 16])

    def test_bytes(self):
        self.assertEqual(self.run_two("bytes", 2), [0, 0])

    def test_window_one(self):
        """Window 1, as replicas before windows: one batch at a time, always
        at row 0."""
        self.assertEqual(self.run_two("ref", 1), [0, 0])

    def test_bad_window(self):
        with self.assertRaisesRegex(InvalidArgumentError, "window=5"):
            serve.Replica(self.node.addr, "policy", mlp(0), token=self.node.token, root=self.node.root, window=5)


if __name__ == "__main__":
    unittest.main()
