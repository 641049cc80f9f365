"""serve.Client.close() fails the predictions in flight with ClosedError
(its docstring), also a predict() waiting for its call's answer on a
connection the Client shares (node= a tensorwire.Client), which close()
does not close."""

import threading
import time
import unittest

import numpy as np

import tensorwire
from tensorwire import serve

from nodes import Node


class TestCloseFailsSyncPredict(unittest.TestCase):
    def test_close_fails_a_predict_waiting_on_a_shared_connection(self):
        # No replica ever attaches; the node holds a request up to 60 s.
        node = Node(extra=["--serve", "policy,replicas=0,input=obs:float32:4,output=logits:float32:2,"
                                      "max-batch=4,attach-wait=60s"]).start()
        self.addCleanup(node.close)
        rc = tensorwire.Client(node.addr, token=node.token)
        self.addCleanup(rc.close)
        c = serve.Client(rc, "policy", bytes_mode=True)
        got = []

        def run():
            try:
                c.predict({"obs": np.zeros((1, 4), np.float32)})
                got.append(None)
            except BaseException as e:  # noqa: BLE001
                got.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        time.sleep(1.0)  # the call is in flight, the node waiting for a replica
        self.assertEqual(got, [])
        c.close()
        t.join(5)
        self.assertFalse(t.is_alive(), "predict still waits 5 s after close()")
        self.assertIsInstance(got[0], serve.ClosedError)
        # The shared connection still serves.
        self.assertIsInstance(rc.stats(timeout=10), dict)

    def test_predictions_on_a_shared_connection_still_come(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not installed in this interpreter")
        node = Node(extra=["--serve", "policy,replicas=0,input=obs:float32:4,output=logits:float32:2,"
                                      "max-batch=4"]).start()
        self.addCleanup(node.close)
        r = serve.Replica(node.addr, "policy", lambda x: x[:, :2] * 2, token=node.token, root=node.root).start()
        self.addCleanup(r.close)
        rc = tensorwire.Client(node.addr, token=node.token)
        self.addCleanup(rc.close)
        with serve.Client(rc, "policy", bytes_mode=True) as c:
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            for _ in range(20):
                np.testing.assert_array_equal(c.predict({"obs": x}, timeout=60)["logits"], x[:, :2] * 2)
            futs = [c.predict_async({"obs": x}, timeout=60) for _ in range(8)]
            for f in futs:
                np.testing.assert_array_equal(f.result(60)["logits"], x[:, :2] * 2)


if __name__ == "__main__":
    unittest.main()
