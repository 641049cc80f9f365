"""The serve client against real Go nodes serving the MLP of serve/mlp
(`tensorwire node --serve`): outputs equal to the Go client's for the same
inputs, many predictions in flight at once (futures and asyncio), errors by
reason (a wrong schema refused before anything is sent, no such model, a full
queue, a wrong token), the node killed and restarted under predictions, and
the client's slots under the root."""

import asyncio
import collections
import concurrent.futures
import os
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

import tensorwire
from tensorwire import serve

from nodes import TOKEN, CountingProxy, HandlerNode, Node, goclient, wait_until, write_state_dict

MODES = ("ref", "bytes")
SIZES = [64, 256, 16]


def mlp_params(sizes, seed):
    """A state_dict of nn.Sequential(Linear, ReLU, Linear, ...) of the given
    widths: "0.weight" [out, in], "0.bias", "2.weight", ..."""
    rng = np.random.default_rng(seed)
    sd = {}
    for i in range(len(sizes) - 1):
        sd[f"{2 * i}.weight"] = (rng.normal(size=(sizes[i + 1], sizes[i])) / np.sqrt(sizes[i])).astype(np.float32)
        sd[f"{2 * i}.bias"] = (rng.normal(size=sizes[i + 1]) * 0.1).astype(np.float32)
    return sd


def forward(sd, x):
    """The MLP's forward pass in numpy, in float64 (what the node's float32
    outputs are compared with, to 1e-4)."""
    h = x.astype(np.float64)
    layers = len(sd) // 2
    for i in range(layers):
        h = h @ sd[f"{2 * i}.weight"].T.astype(np.float64) + sd[f"{2 * i}.bias"]
        if i < layers - 1:
            h = np.maximum(h, 0)
    return h


def model_node(name="policy", sizes=SIZES, seed=1, settings="", token=TOKEN):
    """A node (not started) serving the MLP as name, its params under the
    root; returns (node, state_dict)."""
    sd = mlp_params(sizes, seed)
    node = Node(token=token)
    write_state_dict(os.path.join(node.root, name), sd)
    node.extra = ["--serve", f"{name},params={name}" + settings]
    return node, sd


def dial(node, mode, name="policy", **kw):
    return serve.Client(node.addr, name, token=node.token, root=node.root, bytes_mode=mode == "bytes", **kw)


class MLPNodeCase:
    """For a unittest.TestCase: one started node for the class's tests,
    serving the MLP as "policy" (max batch 16, 2 replicas), its
    state_dict as cls.sd."""

    @classmethod
    def setUpClass(cls):
        cls.node, cls.sd = model_node(settings=",max-batch=16,replicas=2")
        cls.node.start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def obs(self, n, seed=0):
        return np.random.default_rng(seed).normal(size=(n, SIZES[0])).astype(np.float32)


class TestServe(MLPNodeCase, unittest.TestCase):
    def test_modes(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as c:
                self.assertEqual((c.mode, c.sharing), (mode, "coherent"))
                self.assertEqual(c.max_batch, 16)
                self.assertEqual(c.input_schema, [{"key": ["obs"], "dtype": "torch.float32", "shape": [64]}])
                self.assertEqual(c.output_schema, [{"key": ["logits"], "dtype": "torch.float32", "shape": [16]}])
        with serve.Client(self.node.addr, "policy", token=TOKEN) as c:  # no root: bytes
            self.assertEqual((c.mode, c.sharing), ("bytes", "none"))

    def test_predict_matches_the_go_client(self):
        """The same inputs give the Go client's outputs (serve.Client, run by
        tests/goclient) and the MLP's, by reference and by bytes."""
        x = self.obs(5, seed=7)
        with tempfile.TemporaryDirectory() as d:
            inp, outp = os.path.join(d, "in"), os.path.join(d, "out")
            x.tofile(inp)
            for mode in MODES:
                with self.subTest(mode=mode):
                    args = [goclient(), "-addr", self.node.addr, "-name", "policy", "-token-file", self.node.token_file]
                    if mode == "ref":
                        args += ["-root", self.node.root]
                    r = subprocess.run(args + ["predict", inp, outp], capture_output=True, text=True, timeout=120)
                    self.assertEqual(r.returncode, 0, r.stderr)
                    self.assertEqual(r.stdout.strip(), "version 1")
                    want = np.fromfile(outp, dtype="<f4").reshape(5, 16)
                    with dial(self.node, mode) as c:
                        out, version = c.predict({"obs": x}, timeout=60, return_version=True)
                    self.assertEqual(version, 1)
                    self.assertEqual(out["logits"].dtype, np.float32)
                    np.testing.assert_allclose(out["logits"], want, rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(out["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)

    def test_matches_torch(self):
        try:
            import torch
            from torch import nn
        except ImportError:
            self.skipTest("no torch (apt-get install python3-torch)")
        m = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 16))
        m.load_state_dict({k: torch.from_numpy(v) for k, v in self.sd.items()})
        x = torch.from_numpy(self.obs(3, seed=3))
        with dial(self.node, "ref") as c:
            out = c.predict({"obs": x}, timeout=60, as_torch=True)
        self.assertIsInstance(out["logits"], torch.Tensor)
        with torch.no_grad():
            want = m(x)
        self.assertTrue(torch.allclose(out["logits"], want, atol=1e-5), (out["logits"] - want).abs().max())

    def test_one_array(self):
        """A model with one input takes the array itself."""
        x = self.obs(2, seed=4)
        with dial(self.node, "bytes") as c:
            np.testing.assert_array_equal(c.predict(x, timeout=60)["logits"], c.predict({"obs": x})["logits"])

    def test_64_in_flight(self):
        """64 predictions in flight at once from one client, as futures and in
        asyncio: every one answered with its own rows' outputs."""
        xs = self.obs(64 * 2, seed=11).reshape(64, 2, 64)
        want = [forward(self.sd, x) for x in xs]
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as c:
                before = c.stats()
                futs = [c.predict_async({"obs": x}, timeout=120) for x in xs]
                for f, w in zip(futs, want):
                    np.testing.assert_allclose(f.result(timeout=180)["logits"], w, rtol=1e-4, atol=1e-4)

                async def main():
                    return await asyncio.gather(*(c.apredict({"obs": x}, timeout=120, return_version=True) for x in xs))

                res = asyncio.run(main())
                for (out, version), w in zip(res, want):
                    self.assertEqual(version, 1)
                    np.testing.assert_allclose(out["logits"], w, rtol=1e-4, atol=1e-4)
                after = c.stats()
                self.assertEqual(after["requests"] - before["requests"], 128)

    def test_async_retry_failing(self):
        """An asynchronous prediction sent again after the node was
        unreachable, whose retry fails before it is sent (here its backoff
        raises), fails its future with that error instead of leaving it
        waiting; the client goes on."""
        with dial(self.node, "bytes") as c:
            send, backoff = c._send, c._backoff
            state = {"sends": 0}

            def unreachable_once(req):
                state["sends"] += 1
                if state["sends"] == 1:
                    raise tensorwire.UnavailableError("the node, unreachable for this test")
                return send(req)

            def broken(req):
                c._backoff = backoff
                raise RuntimeError("the retry's own failure")

            c._send, c._backoff = unreachable_once, broken
            fut = c.predict_async(self.obs(1, seed=3), timeout=60)
            with self.assertRaisesRegex(RuntimeError, "the retry's own failure"):
                fut.result(10)
            x = self.obs(2, seed=4)
            np.testing.assert_allclose(c.predict_async(x, timeout=60).result(60)["logits"], forward(self.sd, x),
                                       rtol=1e-4, atol=1e-4)

    def test_more_in_flight_than_slots(self):
        """Requests beyond max_in_flight, or beyond the free slots, wait in
        the client for earlier ones, and all are answered."""
        xs = self.obs(300, seed=5)
        want = forward(self.sd, xs)
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode, slots=16, max_in_flight=8) as c:
                futs = [c.predict_async(xs[i:i + 1], timeout=120) for i in range(300)]
                got = np.concatenate([f.result(timeout=180)["logits"] for f in futs])
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
                # and blocking predicts from threads meanwhile
                errs = []

                def loop(k):
                    try:
                        for i in range(k, 300, 4):
                            np.testing.assert_allclose(c.predict(xs[i:i + 1], timeout=120)["logits"][0], want[i],
                                                       rtol=1e-4, atol=1e-4)
                    except Exception as e:  # noqa: BLE001
                        errs.append(e)

                ts = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
                futs = [c.predict_async(xs[i:i + 1], timeout=120) for i in range(100)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(180)
                for i, f in enumerate(futs):
                    np.testing.assert_allclose(f.result(timeout=180)["logits"][0], want[i], rtol=1e-4, atol=1e-4)
                self.assertEqual(errs, [])

    def test_wrong_schema_refused_before_sending(self):
        """Inputs that do not fit the model raise SchemaError (an
        InvalidArgumentError, reason serve.schema) and send nothing."""
        proxy = CountingProxy(self.node.addr)
        try:
            for mode in MODES:
                with self.subTest(mode=mode):
                    c = serve.Client(proxy.addr, "policy", token=TOKEN, root=self.node.root,
                                     bytes_mode=mode == "bytes")
                    x = self.obs(2)
                    c.predict({"obs": x}, timeout=60)
                    bad = [
                        {"obs": x.astype(np.float64)},  # dtype
                        {"obs": x[:, :63]},  # row shape
                        {"obs": x[0]},  # no batch dimension
                        {"obs": np.zeros((0, 64), np.float32)},  # no rows
                        {"obs": np.zeros((17, 64), np.float32)},  # more than the max batch
                        {"obs": x, "extra": x},  # a key too many
                        {"observation": x},  # not the model's key
                        {"obs": {"x": x}},  # a dict where a tensor goes
                        {"obs": np.array([["a"] * 64] * 2)},  # not a tensor dtype
                        {"obs": tensorwire.NonTensorData(1)},
                        [[1.0] * 64],  # a list: int/float64, not float32
                    ]
                    up, _ = proxy.counts()
                    for b in bad:
                        with self.assertRaises(serve.SchemaError) as cm:
                            c.predict(b)
                        self.assertIsInstance(cm.exception, tensorwire.InvalidArgumentError)
                        self.assertEqual(cm.exception.reason, "serve.schema")
                        with self.assertRaises(serve.SchemaError):
                            c.predict_async(b)
                    up2, _ = proxy.counts()
                    self.assertLessEqual(up2 - up, 24, "bytes went up for refused inputs")
                    c.close()
        finally:
            proxy.close()

    def test_node_checks_too(self):
        """The node refuses what the client would have: a request made by
        hand, past the client's checks, is the same SchemaError."""
        with tensorwire.Client(self.node.addr, token=TOKEN) as rc:
            with self.assertRaises(serve.SchemaError):
                rc.call("serve.predict", {"name": "policy", "client": 0, "start": 0, "n": 1,
                                          "in": tensorwire.TD({"obs": np.zeros((1, 63), np.float32)})})

    def test_not_found(self):
        with self.assertRaises(serve.NotFoundError) as cm:
            serve.Client(self.node.addr, "nope", token=TOKEN)
        self.assertIsInstance(cm.exception, tensorwire.NotFoundError)
        self.assertEqual(cm.exception.reason, "serve.not_found")

    def test_wrong_token(self):
        with self.assertRaises(tensorwire.UnauthenticatedError):
            serve.Client(self.node.addr, "policy", token=b"not the token", timeout=10)

    def test_closed(self):
        for mode in MODES:
            with self.subTest(mode=mode):
                c = dial(self.node, mode)
                c.close()
                c.close()
                with self.assertRaises(serve.ClosedError):
                    c.predict(self.obs(1))
                with self.assertRaises(serve.ClosedError):
                    c.predict_async(self.obs(1))

    def test_slots_under_the_root(self):
        """By reference the client's slots are a folder of its own under the
        root, registered with the node; close unregisters it and removes it,
        and the folder of a client that died is removed by the next one."""
        clients = os.path.join(self.node.root, *serve.CLIENTS_DIR.split("/"))
        c = dial(self.node, "ref")
        c.predict(self.obs(1), timeout=60)
        mine = os.path.basename(c._dir)
        self.assertTrue(os.path.isdir(os.path.join(clients, mine, "in")))
        self.assertIn(mine, os.listdir(clients))
        held = c.stats()["clients"]
        c.close()
        self.assertNotIn(mine, os.listdir(clients))
        with dial(self.node, "ref") as c2:
            self.assertEqual(c2.stats()["clients"], held)  # c's went, c2's came
        # A dead client's folder (its lock free) goes when the next dials.
        dead = os.path.join(clients, "0123456789abcdef")
        os.makedirs(dead)
        open(os.path.join(dead, "lock"), "w").close()
        with dial(self.node, "ref") as c3:
            self.assertFalse(os.path.exists(dead))
            # and a live client's folder stays: its lock is held
            with dial(self.node, "ref") as c4:
                self.assertTrue(os.path.isdir(c3._dir))
                c4.predict(self.obs(1), timeout=60)
            c3.predict(self.obs(1), timeout=60)

    def test_node_gone(self):
        """A prediction that finds the node gone is sent again until its
        deadline, then raises UnavailableError (or DeadlineExceededError):
        blocking and asynchronous, in both modes."""
        node, _ = model_node()
        with node:
            cs = [dial(node, mode) for mode in MODES]
            for c in cs:
                c.predict(self.obs(1), timeout=60)
            node.kill()
            for c in cs:
                with self.subTest(mode=c.mode):
                    with self.assertRaises((tensorwire.UnavailableError, tensorwire.DeadlineExceededError)):
                        c.predict(self.obs(1), timeout=0.5)
                    f = c.predict_async(self.obs(1), timeout=0.5)
                    with self.assertRaises((tensorwire.UnavailableError, tensorwire.DeadlineExceededError)):
                        f.result(timeout=60)
                    c.close()


class TestQueueFull(unittest.TestCase):
    def test_queue_full(self):
        """A node whose queue is full refuses at once with QueueFullError (a
        ResourceExhaustedError, reason serve.queue_full), which the client
        does not retry: the caller backs off."""
        node, _ = model_node(sizes=[1024, 2048, 16], settings=",max-batch=1,queue=1,replicas=1")
        with node:
            with dial(node, "bytes", max_in_flight=64) as c:
                x = np.ones((1, 1024), np.float32)
                seen = None
                for _ in range(50):
                    futs = [c.predict_async(x, timeout=120) for _ in range(64)]
                    for f in futs:
                        e = f.exception(timeout=180)
                        if e is not None:
                            self.assertIsInstance(e, serve.QueueFullError)
                            seen = e
                    if seen is not None:
                        break
                self.assertIsNotNone(seen, "64 requests at once never filled a queue of 1 row")
                self.assertIsInstance(seen, tensorwire.ResourceExhaustedError)
                self.assertEqual(seen.reason, "serve.queue_full")
                self.assertGreater(c.stats()["queue_full"], 0)


class TestAdmission(unittest.TestCase):
    """Requests waiting in the client to be admitted (max_in_flight, or the
    free slots by reference) and their deadlines."""

    INFO = {"name": "m", "input": [{"key": ["x"], "dtype": "torch.float32", "shape": [2]}],
            "output": [{"key": ["y"], "dtype": "torch.float32", "shape": [2]}], "max_batch": 4}

    def test_predict_async_deadline_while_waiting_in_the_client(self):
        """predict_async(timeout=t) behind max_in_flight requests that do not
        end (a node that never answers) fails with DeadlineExceededError at
        t, as a blocking predict does, and the requests before it are left
        as they are. Before the fix its deadline was not looked at while it
        waited in the client: its future stayed pending until a request
        before it ended (here never)."""
        def handler(node, c, sid, hdr, arg, body):
            if hdr["method"] == "serve.info":
                node.send(c, sid, node.response(self.INFO))
            # serve.predict: never answered (a slow model, a stuck node)

        node = HandlerNode(handler)
        try:
            c = serve.Client(node.addr, "m", max_in_flight=1, timeout=10)
            try:
                x = {"x": np.ones((1, 2), np.float32)}
                first = c.predict_async(x)  # no timeout: holds the only request in flight
                second = c.predict_async(x, timeout=0.3)
                third = c.predict_async(x, timeout=0.6)
                t0 = time.monotonic()
                for f in (second, third):
                    try:
                        f.result(timeout=3)
                        self.fail("a prediction the node never answered succeeded")
                    except tensorwire.DeadlineExceededError:
                        pass
                    except concurrent.futures.TimeoutError:
                        self.fail("predict_async(timeout=...) still pending after 3 s: its deadline is not "
                                  "enforced while it waits to be admitted")
                self.assertLess(time.monotonic() - t0, 2.0)
                self.assertFalse(first.done())
                self.assertEqual(len(c._waiting), 0)
            finally:
                c.close()
            with self.assertRaises(serve.ClosedError):
                first.result(timeout=5)
        finally:
            node.close()

    def test_request_behind_one_that_timed_out_waiting_is_admitted(self):
        """By reference, a predict that leaves the queue at its deadline lets
        those behind it go when they fit the free slots: here 2 of 8 rows
        are free, the 4-row head of the queue times out, and the 1-row
        request behind it is admitted at once. Before the fix it waited
        until a request in flight ended (here never: it failed at its own
        deadline). Played on the client's admission alone, no node."""
        c = object.__new__(serve.Client)
        c._mu = threading.Lock()
        c._cv = threading.Condition(c._mu)
        c._closed = False
        c._waiting = collections.deque()
        c._expiry = None
        c._admitted = 0
        c.max_in_flight = 128
        c._ref = True
        c._free = serve._Slots(8)
        c._in_mm = [np.zeros((8, 2), np.float32)]

        def req(n, timeout):
            return serve._Req([np.ones((n, 2), np.float32)], n, time.monotonic() + timeout, False, False)

        a = req(6, 60)
        c._acquire(a)  # in flight, holding rows [0, 6)
        b, d = req(4, 0.3), req(1, 3.0)
        errs = {}

        def acquire(r, name):
            try:
                c._acquire(r)
            except Exception as e:  # noqa: BLE001
                errs[name] = e

        tb = threading.Thread(target=acquire, args=(b, "b"))
        tb.start()
        wait_until(lambda: c._waiting, 5, "the 4-row request waiting")
        td = threading.Thread(target=acquire, args=(d, "d"))
        td.start()
        tb.join(5)
        self.assertIsInstance(errs.get("b"), tensorwire.DeadlineExceededError)
        td.join(1.5)
        self.assertFalse(td.is_alive() and not d.holds,
                         "the 1-row request still waits 1.2 s after the head left, with 2 rows free")
        td.join(5)
        self.assertNotIn("d", errs)
        self.assertEqual((d.start, d.n), (6, 1))


class TestNodeKilledAndRestarted(unittest.TestCase):
    """The node is killed (SIGKILL) twice under clients predicting (blocking
    and asynchronously) and started again on the same address: no
    prediction fails, every one is right, and by reference the client
    registers again by itself."""

    def run_mode(self, mode):
        node, sd = model_node(settings=",lease=2s")
        with node:
            c = dial(node, mode)
            x = np.random.default_rng(2).normal(size=(8, 64)).astype(np.float32)
            want = forward(sd, x)
            done = [0, 0]
            errors = []
            stop = threading.Event()

            def sync_loop():
                try:
                    i = 0
                    while not stop.is_set():
                        out = c.predict(x[i % 8:i % 8 + 1], timeout=120)
                        np.testing.assert_allclose(out["logits"][0], want[i % 8], rtol=1e-4, atol=1e-4)
                        done[0] += 1
                        i += 1
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            def async_loop():
                try:
                    while not stop.is_set():
                        futs = [c.predict_async(x[i:i + 1], timeout=120) for i in range(8)]
                        for i, f in enumerate(futs):
                            np.testing.assert_allclose(f.result(timeout=180)["logits"][0], want[i], rtol=1e-4,
                                                       atol=1e-4)
                        done[1] += 1
                except Exception as e:  # noqa: BLE001
                    errors.append(e)

            threads = [threading.Thread(target=sync_loop), threading.Thread(target=async_loop)]
            for t in threads:
                t.start()
            try:
                for kill in range(2):
                    d0 = list(done)
                    wait_until(lambda: (done[0] > d0[0] + 20 and done[1] > d0[1] + 5) or errors,
                               what=f"predictions before kill {kill + 1}")
                    node.kill()
                    time.sleep(0.3)  # requests meet a dead node meanwhile
                    node.start()
                d0 = list(done)
                wait_until(lambda: (done[0] > d0[0] + 20 and done[1] > d0[1] + 5) or errors,
                           what="predictions after the restarts")
            finally:
                stop.set()
                for t in threads:
                    t.join(180)
            self.assertEqual(errors, [])
            self.assertGreaterEqual(c._client.connections, 3)
            if mode == "ref":
                self.assertGreaterEqual(c.registrations, 3)
            c.close()

    def test_ref(self):
        self.run_mode("ref")

    def test_bytes(self):
        self.run_mode("bytes")


if __name__ == "__main__":
    unittest.main()


class TestLinks(unittest.TestCase):
    """A client removes the folders of dead clients and bells it finds
    under the root, and makes its own there: a symbolic link planted on the
    way (by a careless user, or another client) is never followed, and
    nothing where it points is locked or removed."""

    def plant(self, tmp, rel):
        outside = os.path.join(tmp, "outside")
        dead = os.path.join(outside, "00000000000000dd")
        os.makedirs(dead)
        with open(os.path.join(dead, "keep.txt"), "w") as f:
            f.write("mine")
        root = os.path.join(tmp, "root")
        link = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(link))
        os.symlink(outside, link)
        return root, link, dead

    def check_kept(self, dead):
        with open(os.path.join(dead, "keep.txt")) as f:
            self.assertEqual(f.read(), "mine")
        self.assertFalse(os.path.lexists(os.path.join(dead, "lock")), "a lock file made outside the root")

    def test_remove_dead_follows_no_link(self):
        for rel in (serve.CLIENTS_DIR, serve._NODES_DIR):
            with self.subTest(rel=rel), tempfile.TemporaryDirectory() as tmp:
                root, link, dead = self.plant(tmp, rel)
                serve._remove_dead(root, rel)
                self.check_kept(dead)

    def test_dead_folder_link_is_left(self):
        with tempfile.TemporaryDirectory() as tmp:
            outside = os.path.join(tmp, "outside")
            os.makedirs(outside)
            with open(os.path.join(outside, "keep.txt"), "w") as f:
                f.write("mine")
            parent = os.path.join(tmp, "root", *serve.CLIENTS_DIR.split("/"))
            os.makedirs(parent)
            os.symlink(outside, os.path.join(parent, "00000000000000ee"))
            serve._remove_dead(os.path.join(tmp, "root"), serve.CLIENTS_DIR)
            self.check_kept(outside)

    def test_no_slots_through_a_link(self):
        with tempfile.TemporaryDirectory() as tmp:
            root, link, dead = self.plant(tmp, serve.CLIENTS_DIR)
            with self.assertRaises(OSError) as cm:
                serve._check_no_link(root, serve.CLIENTS_DIR)
            self.assertIn(link, str(cm.exception))
            self.assertIn("symbolic link", str(cm.exception))
            self.check_kept(dead)
