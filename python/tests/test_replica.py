"""Replicas in Python processes (tensorwire.serve.Replica) of a model a real
Go node serves with replicas=0: torch modules run the node's batches, by
reference and by bytes, for Python and Go clients, with outputs bit-equal to
the module called directly; and the failures: a replica killed (SIGKILL) or
stopped (SIGSTOP) mid-batch, a module that raises or returns the wrong
shapes, no replica at all."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from tensorwire import serve

from nodes import Node, goclient, python_env, wait_until

try:
    import torch
except ImportError:  # the suite's other interpreter has torch; this test needs it
    torch = None

SCHEMA = "input=obs:float32:64,output=logits:float32:16"


def attached_node(settings="", schema=SCHEMA):
    """A started node serving "policy" with replicas attached only."""
    node = Node(extra=["--serve", f"policy,replicas=0,{schema},max-batch=16{settings}"])
    return node.start()


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))


def obs(n, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 64)).astype(np.float32)


def stats(node):
    with serve.Client(node.addr, "policy", token=node.token, bytes_mode=True) as c:
        return c.stats()


# A replica in a process of its own: argv node address, token, root, and
# what its module does: "mlp" (mlp(0)), "hang" (writes the file argv[5]
# when a forward starts, then sleeps); argv[6] "1" for the batches through
# its lane, else on its stream.
CHILD = r"""
import sys, time, torch
import tensorwire
addr, token, root, what, lane = sys.argv[1], sys.argv[2].encode(), sys.argv[3], sys.argv[4], sys.argv[6] == "1"
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16))
class Hang(torch.nn.Module):
    def forward(self, x):
        open(sys.argv[5], "w").close()
        time.sleep(600)
module = net if what == "mlp" else Hang()
tensorwire.serve.Replica(addr, "policy", module, token=token, root=root, lane=lane).run()
"""


def child_replica(node, what, marker="", lane=True):
    return subprocess.Popen([sys.executable, "-c", CHILD, node.addr, node.token.decode(), node.root, what, marker,
                             "1" if lane else "0"],
                            env=python_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


class AttachedNodeCase:
    """For a unittest.TestCase: one node for the class's tests
    (attached_node), and replicas and clients of its "policy", closed at
    the test's cleanup."""

    @classmethod
    def setUpClass(cls):
        cls.node = attached_node()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def replica(self, module, mode="ref", start=True, **kw):
        """A replica of module by mode ("ref" or "bytes"), started unless
        start is False; kw as serve.Replica takes them."""
        r = serve.Replica(self.node.addr, "policy", module, token=self.node.token, root=self.node.root,
                          bytes_mode=mode == "bytes", **kw)
        self.addCleanup(r.close)
        return r.start() if start else r

    def client(self, mode="ref"):
        c = serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root,
                         bytes_mode=mode == "bytes")
        self.addCleanup(c.close)
        return c


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaBFloat16(unittest.TestCase):
    """A model whose output is bfloat16 (numpy has none: its bits travel as
    uint16): predict(as_torch=True) gives torch.bfloat16 tensors equal to the
    module's, in both of the client's modes."""

    def test_bfloat16_output(self):
        node = attached_node(schema="input=obs:float32:8,output=logits:bfloat16:4")
        self.addCleanup(node.close)
        torch.manual_seed(5)
        module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()).to(torch.bfloat16)

        class Cast(torch.nn.Module):
            def forward(self, x):
                return module(x.to(torch.bfloat16))

        x = obs(3, seed=9)[:, :8].copy()
        with torch.inference_mode():
            want = Cast()(torch.from_numpy(x))
        for rmode in ("ref", "bytes"):
            with serve.Replica(node.addr, "policy", Cast(), token=node.token, root=node.root,
                               bytes_mode=rmode == "bytes") as r:
                r.start()
                for cmode in ("ref", "bytes"):
                    with self.subTest(replica=rmode, client=cmode), serve.Client(
                            node.addr, "policy", token=node.token, root=node.root, bytes_mode=cmode == "bytes") as c:
                        out = c.predict({"obs": x}, timeout=60, as_torch=True)
                        self.assertEqual(out["logits"].dtype, torch.bfloat16)
                        self.assertTrue(torch.equal(out["logits"], want))
                        self.assertEqual(c.predict({"obs": x}, timeout=60)["logits"].dtype, np.uint16)  # numpy: the bits
            wait_until(lambda: stats(node).get("attached_now", 0) == 0, what="the replica detached")


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplica(AttachedNodeCase, unittest.TestCase):
    def test_outputs_are_the_modules(self):
        """Every pair of modes, replica's and client's: the outputs are
        module(input), bit for bit, and the version is the replica's."""
        module = mlp(1)
        for rmode in ("ref", "bytes"):
            with serve.Replica(self.node.addr, "policy", module, token=self.node.token, root=self.node.root,
                               bytes_mode=rmode == "bytes") as r:
                r.start()
                self.assertEqual(r.mode, rmode)
                for cmode in ("ref", "bytes"):
                    with self.subTest(replica=rmode, client=cmode):
                        c = self.client(cmode)
                        for n in (1, 5, 16):
                            x = obs(n, seed=n)
                            out, v = c.predict({"obs": x}, timeout=60, return_version=True)
                            with torch.inference_mode():
                                want = module(torch.from_numpy(x)).numpy()
                            np.testing.assert_array_equal(out["logits"], want)
                            self.assertEqual(v, 0)
                self.assertGreaterEqual(r.batches, 6)
            wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica detached")

    def test_go_client(self):
        """The Go client predicts through a Python replica, in both modes."""
        module = mlp(2)
        self.replica(module)
        x = obs(5, seed=3)
        with torch.inference_mode():
            want = module(torch.from_numpy(x)).numpy()
        with tempfile.TemporaryDirectory() as d:
            inp, outp = os.path.join(d, "in"), os.path.join(d, "out")
            x.tofile(inp)
            for mode in ("ref", "bytes"):
                with self.subTest(mode=mode):
                    args = [goclient(), "-addr", self.node.addr, "-name", "policy", "-token-file",
                            self.node.token_file]
                    if mode == "ref":
                        args += ["-root", self.node.root]
                    r = subprocess.run(args + ["predict", inp, outp], capture_output=True, text=True, timeout=120)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(r.stdout.strip(), "version 0")
                    np.testing.assert_array_equal(np.fromfile(outp, dtype="<f4").reshape(5, 16), want)

    def test_many_clients_two_replicas(self):
        """Two replicas, 8 threads predicting at once: every answer is the
        module's for its own rows."""
        module = mlp(3)
        self.replica(module)
        self.replica(module, mode="bytes")
        wait_until(lambda: stats(self.node).get("attached_now", 0) == 2, what="two replicas attached")
        errs = []

        def work(i):
            try:
                c = serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root)
                with c:
                    for k in range(20):
                        x = obs(1 + (i + k) % 4, seed=100 * i + k)
                        out = c.predict({"obs": x}, timeout=60)
                        with torch.inference_mode():
                            want = module(torch.from_numpy(x)).numpy()
                        np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-6)
            except Exception as e:  # noqa: BLE001 (reported below)
                errs.append(e)

        ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        self.assertEqual(errs, [])

    def test_module_raises(self):
        """A module that raises fails its batch with ForwardError carrying the
        message; the node detaches the replica and it attaches again."""
        class Boom(torch.nn.Module):
            def forward(self, x):
                raise ValueError("boom in forward")
        r = self.replica(Boom())
        c = self.client()
        with self.assertRaisesRegex(serve.ForwardError, "ValueError: boom in forward"):
            c.predict({"obs": obs(2)}, timeout=60)
        wait_until(lambda: r.attachments >= 2, what="the replica attached again")

    def test_wrong_outputs(self):
        """Outputs of the wrong shape, dtype or keys fail the batch with
        ForwardError saying what is wrong, never reach the client."""
        cases = {
            "shape": (lambda x: x[:, :15], "shape \\[2, 15\\], want \\[2, 16\\]"),
            "dtype": (lambda x: x[:, :16].double(), "dtype torch.float64, want torch.float32"),
            "keys": (lambda x: {"action": x[:, :16]}, "missing \\['logits'\\]"),
        }
        for name, (fn, msg) in cases.items():
            with self.subTest(name):
                class Wrong(torch.nn.Module):
                    def forward(self, x, fn=fn):
                        return fn(x)
                with serve.Replica(self.node.addr, "policy", Wrong(), token=self.node.token,
                                   root=self.node.root) as r:
                    r.start()
                    with self.assertRaisesRegex(serve.ForwardError, msg):
                        self.client().predict({"obs": obs(2)}, timeout=60)
                wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the replica detached")

    def test_killed_mid_batch_goes_to_another(self):
        """A replica process killed (SIGKILL) while it runs a batch: the
        batch runs on another replica, and its caller gets the outputs: the
        node learns it from the lane's end, or the stream's without one."""
        self.killed_or_stopped(signal.SIGKILL)
        node = attached_node()  # a node of its own: this class's holds the replica above
        self.addCleanup(node.close)
        self.killed_or_stopped(signal.SIGKILL, node, lane=False)

    def test_killed_mid_batch_none_left(self):
        """The only replica killed mid-batch, and none attaches: its caller
        gets ForwardError once attach-wait (1 s here) has passed, not a
        hang."""
        node = attached_node(",attach-wait=1s")
        self.addCleanup(node.close)
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            p = child_replica(node, "hang", marker)
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
            wait_until(lambda: stats(node).get("attached_now", 0) == 1, what="the child attached")
            c = serve.Client(node.addr, "policy", token=node.token, root=node.root)
            self.addCleanup(c.close)
            fut = c.predict_async({"obs": obs(3)}, timeout=60)
            wait_until(lambda: os.path.exists(marker), what="the child's forward started")
            t0 = time.monotonic()
            p.kill()
            with self.assertRaisesRegex(serve.ForwardError, "went away, and none attached within 1s"):
                fut.result(60)
            self.assertGreaterEqual(time.monotonic() - t0, 0.9)
            self.assertLess(time.monotonic() - t0, 30)

    def test_killed_mid_batch_restarted_runs_it(self):
        """The only replica killed mid-batch, and a replica started after it
        was detached (a supervisor restarting it): the batch waits for it,
        and its caller gets the new replica's outputs."""
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            p = child_replica(self.node, "hang", marker)
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
            wait_until(lambda: stats(self.node).get("attached_now", 0) == 1, what="the child attached")
            c = self.client()
            x = obs(3, seed=11)
            fut = c.predict_async({"obs": x}, timeout=60)
            wait_until(lambda: os.path.exists(marker), what="the child's forward started")
            p.kill()
            wait_until(lambda: stats(self.node).get("attached_now", 0) == 0, what="the killed child detached")
            module = mlp(5)
            r = serve.Replica(self.node.addr, "policy", module, token=self.node.token, root=self.node.root)
            self.addCleanup(r.close)
            r.start()
            out = fut.result(60)
            with torch.inference_mode():
                want = module(torch.from_numpy(x)).numpy()
            np.testing.assert_array_equal(out["logits"], want)

    def killed_or_stopped(self, sig, node=None, lane=True):
        node = node or self.node
        with tempfile.TemporaryDirectory() as d:
            marker = os.path.join(d, "started")
            p = child_replica(node, "hang", marker, lane=lane)
            self.addCleanup(p.wait)
            self.addCleanup(p.kill)
            wait_until(lambda: stats(node).get("attached_now", 0) == 1, what="the child attached")
            c = serve.Client(node.addr, "policy", token=node.token, root=node.root)
            self.addCleanup(c.close)
            x = obs(3, seed=7)
            fut = c.predict_async({"obs": x}, timeout=120)
            wait_until(lambda: os.path.exists(marker), what="the child's forward started")
            module = mlp(4)
            r = serve.Replica(node.addr, "policy", module, token=node.token, root=node.root)
            self.addCleanup(r.close)
            r.start()
            wait_until(lambda: stats(node).get("attached_now", 0) == 2, what="the second replica attached")
            os.kill(p.pid, sig)
            out = fut.result(120)
            with torch.inference_mode():
                want = module(torch.from_numpy(x)).numpy()
            np.testing.assert_array_equal(out["logits"], want)
            self.assertGreaterEqual(r.batches, 1)
            wait_until(lambda: stats(node).get("attached_now", 0) == 1, what="the dead replica detached")

    def test_no_replica(self):
        """With no replica attached a request waits attach-wait (1 s here),
        then fails with NoReplicaError; one attached meanwhile answers it."""
        node = attached_node(",attach-wait=1s")
        self.addCleanup(node.close)
        c = serve.Client(node.addr, "policy", token=node.token, root=node.root)
        self.addCleanup(c.close)
        t0 = time.monotonic()
        with self.assertRaisesRegex(serve.NoReplicaError, "none attached within 1s"):
            c.predict({"obs": obs(1)}, timeout=60)
        self.assertLess(time.monotonic() - t0, 30)
        fut = c.predict_async({"obs": obs(1)}, timeout=60)
        r = serve.Replica(node.addr, "policy", mlp(5), token=node.token, root=node.root)
        self.addCleanup(r.close)
        r.start()
        self.assertEqual(fut.result(60)["logits"].shape, (1, 16))


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaStopped(unittest.TestCase):
    """A replica process stopped (SIGSTOP) mid-batch: silent past the node's
    replica-timeout (2 s here), it is detached and its batch runs on
    another."""

    def test_stopped_mid_batch(self):
        node = attached_node(",replica-timeout=2s")
        self.addCleanup(node.close)
        TestReplica.killed_or_stopped(self, signal.SIGSTOP, node)


@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestReplicaDicts(unittest.TestCase):
    """torch_spread's format: nested input keys arrive as nested dicts, a
    dict of outputs fills the output schema's fields."""

    def test_nested(self):
        node = attached_node(schema="input=obs/image:float32:2x3+obs/vec:float32:4,"
                                    "output=act/mean:float32:2+value:float32:")
        self.addCleanup(node.close)

        class M(torch.nn.Module):
            def forward(self, td):
                img, vec = td["obs"]["image"], td["obs"]["vec"]
                return {"act": {"mean": img.sum(-1) + vec[:, :2]}, "value": vec.sum(-1)}
        for mode in ("ref", "bytes"):
            with self.subTest(mode=mode):
                with serve.Replica(node.addr, "policy", M(), token=node.token, root=node.root,
                                   bytes_mode=mode == "bytes") as r, \
                        serve.Client(node.addr, "policy", token=node.token, root=node.root) as c:
                    r.start()
                    rng = np.random.default_rng(0)
                    img = rng.normal(size=(3, 2, 3)).astype(np.float32)
                    vec = rng.normal(size=(3, 4)).astype(np.float32)
                    out = c.predict({"obs": {"image": img, "vec": vec}}, timeout=60)
                    np.testing.assert_allclose(out["act"]["mean"], img.sum(-1) + vec[:, :2], rtol=1e-6)
                    np.testing.assert_allclose(out["value"], vec.sum(-1), rtol=1e-6)



@unittest.skipIf(torch is None or not torch.cuda.is_available(),
                 "no CUDA device here (torch.cuda.is_available() is false): the CUDA replica test needs one")
class TestReplicaCUDA(unittest.TestCase):
    """Replicas on CUDA devices, one per device: inputs moved from pinned
    host buffers, outputs equal to the module's on the same device."""

    def test_cuda(self):
        node = attached_node()
        self.addCleanup(node.close)
        for i in range(torch.cuda.device_count()):
            dev = f"cuda:{i}"
            module = mlp(6).to(dev)
            with self.subTest(device=dev), \
                    serve.Replica(node.addr, "policy", module, device=dev, token=node.token, root=node.root) as r, \
                    serve.Client(node.addr, "policy", token=node.token, root=node.root) as c:
                r.start()
                x = obs(7, seed=i)
                out = c.predict({"obs": x}, timeout=60)
                with torch.inference_mode():
                    want = module(torch.from_numpy(x).to(dev)).cpu().numpy()
                np.testing.assert_array_equal(out["logits"], want)
            wait_until(lambda: stats(node).get("attached_now", 0) == 0, what="the replica detached")


if __name__ == "__main__":
    unittest.main()
