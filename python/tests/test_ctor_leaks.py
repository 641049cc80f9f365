"""Constructors that fail after they made their own connection (and, for a
Replica following a store, a thread) give them up before they raise:
nothing stays open for as long as the caller keeps the exception, and no
thread polls the store for ever."""

import os
import shutil
import tempfile
import threading
import time
import unittest

from tensorwire import rpc, serve, store

from nodes import Node

try:
    import torch
except ImportError:
    torch = None


class _Recorder:
    """Patches rpc.Client where module binds it so that the clients made are
    recorded."""

    def __init__(self, test, module, attr):
        self.made = []
        orig = getattr(module, attr)
        made = self.made

        class Rec(orig):
            def __init__(self, *a, **kw):
                made.append(self)
                super().__init__(*a, **kw)

        setattr(module, attr, Rec)
        test.addCleanup(setattr, module, attr, orig)


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestCtorLeaks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node(extra=["--store", "main",
                               "--serve", "policy,replicas=0,input=obs:float32:4,output=logits:float32:2,"
                                          "max-batch=4"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def test_replica_not_found_closes_its_client(self):
        from tensorwire import replica
        rec = _Recorder(self, replica, "_RPCClient")
        err = None
        try:
            serve.Replica(self.node.addr, "nosuchmodel", torch.nn.Identity(), token=self.node.token)
        except serve.NotFoundError as e:
            err = e  # kept, as a caller logging it would
        self.assertIsNotNone(err)
        self.assertEqual(len(rec.made), 1)
        self.assertTrue(rec.made[0]._closed, "the Replica's own connection stayed open")

    def test_replica_folder_refused_stops_follower(self):
        from tensorwire import replica
        rec = _Recorder(self, replica, "_RPCClient")
        # A root whose clients folder is a link: serve refuses to make the
        # replica's folder through it (OSError), after the follower started.
        root = self.node.root
        clients = os.path.join(root, ".tensorwire-serve", "clients")
        os.makedirs(os.path.dirname(clients), exist_ok=True)
        saved = None
        if os.path.lexists(clients):
            saved = clients + ".saved"
            os.rename(clients, saved)
        elsewhere = tempfile.mkdtemp()
        os.symlink(elsewhere, clients)

        def restore():
            os.unlink(clients)
            if saved:
                os.rename(saved, clients)
            shutil.rmtree(elsewhere, ignore_errors=True)
        self.addCleanup(restore)
        st = store.Store(self.node.addr, "main", token=self.node.token, root=root)
        self.addCleanup(st.close)
        before = {t for t in threading.enumerate() if t.name == "tensorwire-replica-follow"}
        err = None
        try:
            serve.Replica(self.node.addr, "policy", torch.nn.Identity(), token=self.node.token, root=root,
                          follow=(st, "policy"))
        except OSError as e:
            err = e
        self.assertIsNotNone(err)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            left = [t for t in threading.enumerate() if t.name == "tensorwire-replica-follow" and t not in before]
            if not left:
                break
            time.sleep(0.1)
        self.assertEqual(left, [], "the follower thread of a Replica that failed to start still runs")
        self.assertTrue(rec.made[0]._closed, "the Replica's own connection stayed open")

    def test_serve_client_bad_max_in_flight_closes_its_client(self):
        rec = _Recorder(self, serve, "_RPCClient")
        err = None
        try:
            serve.Client(self.node.addr, "policy", token=self.node.token, max_in_flight=0)
        except serve.ConfigError as e:
            err = e
        self.assertIsNotNone(err)
        self.assertTrue(all(c._closed for c in rec.made), "serve.Client's own connection stayed open")


if __name__ == "__main__":
    unittest.main()
