"""Clients pickled to another process (multiprocessing's spawn start
method, torch.multiprocessing, a pool's workers): each becomes a new
client of the same node and object, with the same token, root and
options, dialled where it is unpickled, as Reverb's Client pickles; a
started Node becomes a NodeHandle of it; a loader Consumer refuses,
saying why. Against a real node, workers
spawned."""

import multiprocessing as mp
import pickle
import unittest

import numpy as np

import tensorwire

try:
    import torch
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False


def _writer(store, buf, rc, q):
    """A spawned worker: writes through what it was handed."""
    try:
        store.append("b", {"x": np.ones(2, np.float32)})
        buf.extend({"obs": np.ones((3, 4), np.float32)})
        q.put({"store": [type(store).__name__, store.mode], "buffer": buf.mode, "client": rc.addr,
               "client_mode": rc.sharing()})
        store.close()
        buf.close()
        rc.close()
    except Exception as e:  # noqa: BLE001
        q.put({"error": repr(e)})


def _node_user(node, q):
    """A spawned worker handed the Node: a store client from it, and its
    stop(), which must leave the node running."""
    try:
        st = tensorwire.store.Store(node.address, "main", token=node.token, root=node.root)
        st.append("w", {"x": np.full(2, 7, np.float32)})
        st.close()
        node.stop()
        q.put({"type": type(node).__name__, "mode": st.mode})
    except Exception as e:  # noqa: BLE001
        q.put({"error": repr(e)})


def _predictor(client, q):
    try:
        out = client.predict({"obs": np.arange(8, dtype=np.float32).reshape(2, 4)}, timeout=60)
        q.put({"mode": client.mode, "logits": out["logits"].tolist()})
        client.close()
    except Exception as e:  # noqa: BLE001
        q.put({"error": repr(e)})


class TestPickle(unittest.TestCase):
    def setUp(self):
        self.ctx = mp.get_context("spawn")

    def test_store_buffer_and_client_to_a_spawned_worker(self):
        with tensorwire.Node(store=["main"], buffer=["rb,capacity=64"]) as node:
            st = tensorwire.store.Store(node.address, "main", root=node.root)
            buf = tensorwire.replay.Buffer(node.address, "rb", root=node.root)
            buf.extend({"obs": np.zeros((2, 4), np.float32)})
            rc = tensorwire.Client(node.address, root=node.root)
            q = self.ctx.Queue()
            p = self.ctx.Process(target=_writer, args=(st, buf, rc, q))
            p.start()
            rep = q.get(timeout=120)
            p.join(60)
            self.assertEqual(p.exitcode, 0)
            self.assertEqual(rep, {"store": ["Store", "ref"], "buffer": "ref", "client": node.address,
                                   "client_mode": "coherent"})
            got = st.get("b")  # a take: the bin is empty after it
            self.assertEqual([i["x"].tolist() for i in got], [[1.0, 1.0]])
            self.assertEqual(buf.stats()["size"], 5)
            # The parent's own clients are untouched.
            st.append("b", {"x": np.zeros(2, np.float32)})
            self.assertEqual([i["x"].tolist() for i in st.get("b")], [[0.0, 0.0]])
            for c in (st, buf, rc):
                c.close()

    @unittest.skipUnless(HAVE_TORCH, "needs torch")
    def test_serve_client_to_a_spawned_worker(self):
        spec = "policy,replicas=0,input=obs:float32:4,output=logits:float32:2,max-batch=16"
        with tensorwire.Node(serve=[spec]) as node:
            torch.manual_seed(0)
            model = torch.nn.Linear(4, 2)
            replica = tensorwire.serve.Replica(node, "policy", model).start()
            client = tensorwire.serve.Client(node.address, "policy", root=node.root)
            q = self.ctx.Queue()
            p = self.ctx.Process(target=_predictor, args=(client, q))
            p.start()
            rep = q.get(timeout=120)
            p.join(60)
            with torch.no_grad():
                want = model(torch.arange(8, dtype=torch.float32).reshape(2, 4)).numpy()
            self.assertEqual(rep.get("mode"), "ref", rep)
            np.testing.assert_allclose(np.array(rep["logits"], np.float32), want, rtol=1e-6)
            client.close()
            replica.close()

    def test_node_to_a_spawned_worker(self):
        """A started Node pickles to a NodeHandle (address, root, token);
        the worker's clients reach the node through it, and its stop()
        there leaves the node running. An unstarted Node refuses."""
        with tensorwire.Node(store=["main"], token="s3cret") as node:
            q = self.ctx.Queue()
            p = self.ctx.Process(target=_node_user, args=(node, q))
            p.start()
            rep = q.get(timeout=120)
            p.join(60)
            self.assertEqual(rep, {"type": "NodeHandle", "mode": "ref"})
            self.assertIsNone(node.proc.poll(), "the worker's stop() stopped the node")
            st = tensorwire.store.Store(node.address, "main", token=node.token, root=node.root)
            self.assertEqual([i["x"].tolist() for i in st.get("w")], [[7.0, 7.0]])
            st.close()
        with self.assertRaisesRegex(TypeError, "start it"):
            pickle.dumps(tensorwire.Node())

    def test_loader_consumer_refuses(self):
        c = tensorwire.loader.Consumer.__new__(tensorwire.loader.Consumer)
        with self.assertRaisesRegex(TypeError, "cannot be pickled.*state_dict"):
            pickle.dumps(c)


if __name__ == "__main__":
    unittest.main()
