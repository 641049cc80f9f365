"""docs/loader.md, "A node that says what no node says": the Python
Producer checks the node's attachment and each grant, and anything else is
InternalError *told to the node as the producer's failure* (so that the
consumers get FailedError rather than wait for another producer). The
attachment's check, and a grant out of order, were raised without a word
to the node."""

import unittest

import numpy as np

import tensorwire
from tensorwire import _msgpack, rpc
from tensorwire.errors import InternalError

from nodes import ScriptedNode


class TestProducerTellsTheNode(unittest.TestCase):
    def produce(self, attached, grants):
        sent = []
        orig = rpc.MessageStream.send

        def send(st, arg, timeout=None):
            sent.append(arg)
            return orig(st, arg, timeout)

        rpc.MessageStream.send = send
        self.addCleanup(setattr, rpc.MessageStream, "send", orig)
        msgs = [(_msgpack.packb({"attached": attached}), b"")]
        msgs += [(_msgpack.packb({"grant": g}), b"") for g in grants]
        node = ScriptedNode([], msgs)
        try:
            data = [{"x": np.zeros((4, 3), np.float32)}, {"x": np.zeros((4, 3), np.float32)}]
            p = tensorwire.loader.Producer(node.addr, "liar", data, samples=8, reattach=False, timeout=10)
            try:
                p.run()
            except Exception as e:  # noqa: BLE001
                return e, sent
            finally:
                p.close()
            return None, sent
        finally:
            node.close()

    def failures(self, sent):
        return [m for m in sent if isinstance(m, dict) and m.get("error")]

    def test_bad_attachment_is_told(self):
        err, sent = self.produce({"ring": "r1", "prefix": "", "slots": 0, "epoch": 0}, [])
        self.assertIsInstance(err, InternalError)
        self.assertEqual(len(self.failures(sent)), 1, f"sent {sent!r}")

    def test_grant_out_of_order_is_told(self):
        g = {"epoch": 0, "index": 0, "count": 2, "slot": 0, "rows": 4}
        err, sent = self.produce({"ring": "r1", "prefix": "", "slots": 2, "epoch": 0}, [g, g])
        self.assertIsInstance(err, InternalError)
        self.assertIn("want 1", str(err))
        self.assertEqual(len(self.failures(sent)), 1, f"sent {sent!r}")


class TestRingNotThere(unittest.TestCase):
    def test_map_ring_of_a_missing_or_broken_folder_is_internal(self):
        """A ring the node described but that is not there (removed, not a
        TensorDict) is the library's InternalError, not a raw
        FileNotFoundError or dataset.FormatError (a ValueError)."""
        import os
        import tempfile
        from tensorwire.loader import _map_ring
        info = {"slots": 2, "batch": 4, "schema": [{"key": ["x"], "dtype": "torch.float32", "shape": [3]}]}
        with tempfile.TemporaryDirectory() as d:
            for path in (os.path.join(d, "gone"), d):
                if path == d:
                    os.makedirs(os.path.join(d, "storage"))
                    with open(os.path.join(d, "storage", "meta.json"), "w") as f:
                        f.write("{not json")
                with self.subTest(path=path), self.assertRaises(InternalError):
                    _map_ring(path, info)


if __name__ == "__main__":
    unittest.main()
