"""The Python serve client by bell (tensorwire/_bell.py, serve/bell.go)
against real Go nodes: in ref mode on Linux x86-64 predict() appends its
request to a ring file and rings the node's bell with a futex, and waits on
its record with a futex, nothing on the TCP connection; its outputs are the
model's, from many threads at once and beside Go clients; a request that
fails brings its error (fetched with serve.failure); one abandoned at its
deadline keeps its slots until the node is done with them; close() wakes
the ones waiting; the node killed and restarted is registered with again
and the request pushed again (test_serve.TestNodeKilledAndRestarted runs
the same by bell now). predict_async and apredict go by bell too where the
kernel has futex_waitv, one collector thread watching every request's
record: the same outputs, errors, deadlines and close, more requests in
flight than one futex_waitv takes, and by call where it has none. A request
waiting for room in a full ring, or for a registration the node dropped,
asks the node whether it holds it and registers again; one whose client
registered again before its push is pushed once."""

import asyncio

import subprocess
import threading
import time
import unittest

import numpy as np

import tensorwire
from tensorwire import _bell, serve

from nodes import CountingProxy, goclient, wait_until
from test_replica import attached_node, mlp, obs
from test_serve import MLPNodeCase, dial, forward, model_node

try:
    import torch
except ImportError:
    torch = None


@unittest.skipUnless(_bell.SUPPORTED, "the bell from Python is for Linux on x86-64; requests go by call elsewhere")
class TestBell(MLPNodeCase, unittest.TestCase):
    def test_nothing_on_the_connection(self):
        """By bell a prediction sends nothing over TCP: through a proxy that
        counts the bytes, 200 predictions by bell move fewer bytes than one
        call does (the mean of 20 by call)."""
        proxy = CountingProxy(self.node.addr)
        moved = {}
        for mode in ("ref", "bytes"):
            with serve.Client(proxy.addr, "policy", token=self.node.token, root=self.node.root,
                              bytes_mode=mode == "bytes") as c:
                self.assertEqual(c.bell, mode == "ref")
                before = proxy.up + proxy.down
                for i in range(200 if mode == "ref" else 20):
                    x = obs(1 + i % 16, seed=i)
                    np.testing.assert_allclose(c.predict(x)["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)
                moved[mode] = proxy.up + proxy.down - before
        self.assertLess(moved["ref"], moved["bytes"] / 20, moved)

    def test_threads(self):
        """8 threads predicting at once through one client: every output is
        its own input's."""
        with dial(self.node, "ref") as c:
            self.assertTrue(c.bell)
            errs = []

            def run(k):
                try:
                    for i in range(60):
                        x = obs(1 + (i + k) % 16, seed=1000 * k + i)
                        np.testing.assert_allclose(c.predict(x)["logits"], forward(self.sd, x), rtol=1e-4,
                                                   atol=1e-4)
                except BaseException as e:  # noqa: BLE001
                    errs.append(e)

            ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            self.assertEqual(errs, [])

    def test_async_nothing_on_the_connection(self):
        """predict_async and apredict by bell: 200 predictions in flight at
        once, and 64 asyncio tasks, move fewer bytes than one call does, and
        each output is its own input's."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        proxy = CountingProxy(self.node.addr)
        with serve.Client(proxy.addr, "policy", token=self.node.token, root=self.node.root,
                          max_in_flight=256) as c:
            before = proxy.up + proxy.down
            xs = [obs(1 + i % 4, seed=i) for i in range(200)]  # 500 rows: fits the 1,024 slots
            futs = [c.predict_async(x, timeout=60) for x in xs]
            for x, f in zip(xs, futs):
                np.testing.assert_allclose(f.result(60)["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)

            async def main():
                return await asyncio.gather(*(c.apredict(x, timeout=60) for x in xs[:64]))

            for x, out in zip(xs, asyncio.run(main())):
                np.testing.assert_allclose(out["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)
            moved = proxy.up + proxy.down - before
        with serve.Client(proxy.addr, "policy", token=self.node.token, root=self.node.root, bytes_mode=True) as c:
            before = proxy.up + proxy.down
            for i in range(20):
                c.predict_async(obs(1 + i % 4, seed=i), timeout=60).result(60)
            call = (proxy.up + proxy.down - before) / 20
        self.assertLess(moved, call)

    def test_async_more_than_one_waitv(self):
        """More requests in flight than one futex_waitv watches (127 records
        and the collector's word): those left out are looked at every
        millisecond, and all finish with their own outputs."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        with serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root,
                          max_in_flight=256) as c:
            for rnd in range(3):
                xs = [obs(1, seed=1000 * rnd + i) for i in range(250)]
                futs = [c.predict_async(x, timeout=60) for x in xs]
                for x, f in zip(xs, futs):
                    np.testing.assert_allclose(f.result(60)["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)
            self.assertEqual(c._free.free, [(0, c.slots)])

    def test_async_ringing_fails(self):
        """A request admitted when an earlier one ends, whose ringing fails
        (here: made to), fails alone through its future: the earlier one
        keeps its outputs, and the client goes on."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        with serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root,
                          max_in_flight=1) as c:
            real, calls = c._ring_async, []

            def ring(req):
                calls.append(req)
                if len(calls) == 2:
                    raise MemoryError("ringing made to fail")
                return real(req)

            c._ring_async = ring
            x1, x2, x3 = obs(2, seed=1), obs(3, seed=2), obs(4, seed=3)
            f1 = c.predict_async(x1, timeout=60)
            f2 = c.predict_async(x2, timeout=60)  # waits for f1's end to be admitted
            np.testing.assert_allclose(f1.result(60)["logits"], forward(self.sd, x1), rtol=1e-4, atol=1e-4)
            with self.assertRaisesRegex(MemoryError, "ringing made to fail"):
                f2.result(60)
            np.testing.assert_allclose(c.predict_async(x3, timeout=60).result(60)["logits"], forward(self.sd, x3),
                                       rtol=1e-4, atol=1e-4)
            # The failed request's rows are kept the second an error from
            # outside the node's answers keeps them (the node might write
            # them), then given back.
            wait_until(lambda: c._free.free == [(0, c.slots)], what="every slot given back")

    def test_async_by_call_without_waitv(self):
        """Where the kernel has no futex_waitv, predict_async goes by call
        (each moves a call's bytes) while predict still goes by bell."""
        proxy = CountingProxy(self.node.addr)
        saved = _bell._waitv_ok
        _bell._waitv_ok = False
        self.addCleanup(setattr, _bell, "_waitv_ok", saved)
        with serve.Client(proxy.addr, "policy", token=self.node.token, root=self.node.root) as c:
            self.assertTrue(c.bell)
            before = proxy.up + proxy.down
            x = obs(3, seed=7)
            np.testing.assert_allclose(c.predict_async(x, timeout=60).result(60)["logits"], forward(self.sd, x),
                                       rtol=1e-4, atol=1e-4)
            by_call = proxy.up + proxy.down - before
            before = proxy.up + proxy.down
            np.testing.assert_allclose(c.predict(x, timeout=60)["logits"], forward(self.sd, x), rtol=1e-4,
                                       atol=1e-4)
            by_bell = proxy.up + proxy.down - before
        self.assertGreater(by_call, 100)
        self.assertLess(by_bell, by_call)

    def test_beside_go_clients(self):
        """A Go client by bell and a Python one on the same node's bell."""
        go = subprocess.Popen([goclient(), "-addr", self.node.addr, "-name", "policy", "-token-file",
                               self.node.token_file, "-root", self.node.root, "bench", "4", "2s"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            with dial(self.node, "ref") as c:
                for i in range(300):
                    x = obs(1 + i % 16, seed=i)
                    np.testing.assert_allclose(c.predict(x)["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)
        finally:
            out, err = go.communicate(timeout=120)
        self.assertEqual(go.returncode, 0, err)
        self.assertGreater(float(out.split()[-1]), 0)


class _RegisterFirst:
    """A ring's lock that registers its client again (as the client's
    renewer does when the node lost the registration) the first time it is
    taken, before taking it: a push after the request read the registration
    it will wait under falls in the window where the client registered
    again meanwhile."""

    def __init__(self, c):
        self.c, self.real, self.fired = c, c._ring.mu, False

    def __enter__(self):
        if not self.fired:
            self.fired = True
            self.c._register(self.c._id, serve._deadline(30))  # its ring.use_bell takes this lock, fired
        self.real.acquire()

    def __exit__(self, *exc):
        self.real.release()


def fill_ring(c):
    """Leaves c's ring full, as a node gone with requests in it does: its
    tail moved on by the room left (the entries are never read: a node
    registering the client again drops them)."""
    q, slots = c._ring.q, c._ring.slots
    q[0] = q[8] + slots  # the tail (byte 0) = the head (byte 64) + slots
    assert q[0] - q[8] == slots


@unittest.skipUnless(_bell.SUPPORTED, "the bell from Python is for Linux on x86-64; requests go by call elsewhere")
class TestBellRegistration(unittest.TestCase):
    """By bell against a node of its own, its lease 10 minutes: the
    client's renewer (every quarter of the lease) never runs during a test,
    so what registers the client again is the requests' own probes."""

    def setUp(self):
        self.node, self.sd = model_node(settings=",max-batch=16,lease=10m")
        self.node.start()
        self.addCleanup(self.node.close)

    def client(self, **kw):
        c = dial(self.node, "ref", **kw)
        self.addCleanup(c.close)
        self.assertTrue(c.bell)
        return c

    def test_full_ring_asks_whether_the_registration_is_held(self):
        """The node killed with requests in the ring (fill_ring: entries
        nobody took, the ring full), then started
        again: the next predict waits for room, asks the node every half
        second whether it holds the registration, registers again (which
        empties the ring) and is answered within seconds. Before the fix a
        request waiting for room asked nothing: it waited for the renewer
        (10 minutes / 4 here) and failed at its deadline."""
        c = self.client(slots=4)
        x = obs(1, seed=4)
        want = forward(self.sd, x)
        np.testing.assert_allclose(c.predict(x, timeout=60)["logits"], want, rtol=1e-4, atol=1e-4)
        self.node.kill()
        fill_ring(c)
        self.node.start()
        t0 = time.monotonic()
        np.testing.assert_allclose(c.predict(x, timeout=8)["logits"], want, rtol=1e-4, atol=1e-4)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(c.registrations, 2)

    def test_full_ring_wait_ends_at_close(self):
        """The node gone for good with the ring full: a predict with no
        deadline waits for room, sleeping (under a fifth of a core), and
        close() ends it with ClosedError at once. (This one passed before
        the fix too: the wait for room looked at close already.)"""
        c = self.client(slots=2)
        np.testing.assert_allclose(c.predict(obs(1), timeout=60)["logits"], forward(self.sd, obs(1)),
                                   rtol=1e-4, atol=1e-4)
        self.node.kill()
        fill_ring(c)
        got = []

        def run():
            try:
                c.predict(obs(1))
            except BaseException as e:  # noqa: BLE001
                got.append(e)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        cpu, t1 = time.process_time(), time.monotonic()
        time.sleep(1)
        used = (time.process_time() - cpu) / (time.monotonic() - t1)
        self.assertTrue(t.is_alive())
        t0 = time.monotonic()
        c.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], serve.ClosedError)
        self.assertLess(used, 0.2)

    def test_dropped_registration_is_made_anew(self):
        """The node drops the client's registration behind its back (as at a
        lost lease): it answers nothing by bell for it, and the request
        pushed asks within a second whether the registration is held,
        registers again and is pushed and answered again; the same for
        predict_async. (Passed before the fix too: a request waiting for
        its record asked the node already.)"""
        c = self.client()
        for i, how in enumerate(("predict", "predict_async")):
            with self.subTest(how=how):
                regs = c.registrations
                c._client.call("serve.unregister", {"name": "policy", "client": c._id}, timeout=10)
                x = obs(2, seed=10 + i)
                t0 = time.monotonic()
                out = c.predict(x, timeout=30) if how == "predict" else c.predict_async(x, timeout=30).result(30)
                self.assertLess(time.monotonic() - t0, 5)
                np.testing.assert_allclose(out["logits"], forward(self.sd, x), rtol=1e-4, atol=1e-4)
                self.assertEqual(c.registrations, regs + 1)


def direct(net, x):
    """net's output for rows x, called directly: what a replica of it
    answers."""
    with torch.inference_mode():
        return net(torch.from_numpy(x)).numpy()


@unittest.skipUnless(_bell.SUPPORTED, "the bell from Python is for Linux on x86-64; requests go by call elsewhere")
@unittest.skipIf(torch is None, "torch is not installed in this interpreter")
class TestBellAttached(unittest.TestCase):
    """By bell against a model whose replica is a Python process the test
    controls: failures, deadlines, close."""

    def setUp(self):
        self.node = attached_node(",attach-wait=30s")
        self.addCleanup(self.node.close)

    def replica(self, module):
        r = serve.Replica(self.node.addr, "policy", module, token=self.node.token, root=self.node.root)
        self.addCleanup(r.close)
        return r.start()

    def gated(self, forward):
        """Attaches a replica whose module waits for the returned gate, then
        runs forward. The gate opens at cleanup before the replica's
        close, which waits for a forward under way."""
        gate = threading.Event()

        class Gated(torch.nn.Module):
            def forward(self, x):
                gate.wait(60)
                return forward(x)

        self.replica(Gated())
        self.addCleanup(gate.set)
        return gate

    def client(self):
        c = serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root, slots=32)
        self.addCleanup(c.close)
        self.assertTrue(c.bell)
        return c

    def test_failure_brings_its_error(self):
        class Boom(torch.nn.Module):
            def forward(self, x):
                raise ValueError("boom by bell")

        self.replica(Boom())
        c = self.client()
        with self.assertRaisesRegex(serve.ForwardError, "boom by bell"):
            c.predict(obs(2), timeout=60)

    def test_deadline_keeps_the_slots(self):
        """A request abandoned at its deadline while the node still holds it
        keeps its slots until the node is done: the requests after it, on
        other slots, get their own rows; once the replica answers, the
        slots come back."""
        net = mlp(3)
        gate = self.gated(net)
        c = self.client()
        with self.assertRaises(tensorwire.DeadlineExceededError):
            c.predict(obs(16, seed=1), timeout=0.3)
        self.assertEqual(c._free.free, [(16, 16)])  # rows 0-15 held while the node may still write them
        time.sleep(1.3)  # past the second a call's abandoned slots are kept
        self.assertEqual(c._free.free, [(16, 16)])
        fut = c.predict_async(obs(16, seed=2), timeout=60)  # on the other 16 slots
        gate.set()
        x = obs(16, seed=2)
        want = direct(net, x)
        np.testing.assert_array_equal(fut.result(60)["logits"], want)
        # The abandoned request's slots come back once its record says done:
        # then two requests of 16 rows fit in the 32 slots again.
        wait_until(lambda: c._free.free == [(0, 32)], what="the abandoned request's slots given back")
        for seed in (5, 6):
            x = obs(16, seed=seed)
            want = direct(net, x)
            np.testing.assert_array_equal(c.predict(x, timeout=60)["logits"], want)

    def test_async_failure_brings_its_error(self):
        class Boom(torch.nn.Module):
            def forward(self, x):
                raise ValueError("boom by bell, asynchronously")

        self.replica(Boom())
        c = self.client()
        futs = [c.predict_async(obs(2, seed=i), timeout=60) for i in range(3)]
        for f in futs:
            with self.assertRaisesRegex(serve.ForwardError, "boom by bell, asynchronously"):
                f.result(60)
        self.assertEqual(c._free.free, [(0, 32)])

    def test_async_deadline_keeps_the_slots(self):
        """predict_async's deadline passing while the node holds its request:
        the future fails with DeadlineExceededError at the deadline, and
        the slots stay held until the node is done with them."""
        net = mlp(3)
        gate = self.gated(net)
        c = self.client()
        t0 = time.monotonic()
        fut = c.predict_async(obs(16, seed=1), timeout=0.3)
        with self.assertRaises(tensorwire.DeadlineExceededError):
            fut.result(10)
        self.assertLess(time.monotonic() - t0, 5)  # at its deadline, not the replica's 60 s
        self.assertEqual(c._free.free, [(16, 16)])
        gate.set()
        wait_until(lambda: c._free.free == [(0, 32)], what="the abandoned request's slots given back")
        x = obs(16, seed=5)
        want = direct(net, x)
        np.testing.assert_array_equal(c.predict_async(x, timeout=60).result(60)["logits"], want)

    def test_async_waits_without_spinning(self):
        """200 asynchronous predictions waiting on a replica that holds its
        batch, more than one futex_waitv watches: the client's threads
        sleep (under a fifth of a core over a second), and all finish with
        their own outputs once the replica goes on."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        net = mlp(4)
        gate = self.gated(net)
        c = serve.Client(self.node.addr, "policy", token=self.node.token, root=self.node.root, slots=256,
                         max_in_flight=256)
        self.addCleanup(c.close)
        xs = [obs(1, seed=i) for i in range(200)]
        futs = [c.predict_async(x, timeout=60) for x in xs]
        time.sleep(0.5)
        cpu, t0 = time.process_time(), time.monotonic()
        time.sleep(1)
        used = (time.process_time() - cpu) / (time.monotonic() - t0)
        gate.set()
        for x, f in zip(xs, futs):
            want = direct(net, x)
            np.testing.assert_allclose(f.result(60)["logits"], want, rtol=1e-5, atol=1e-6)
        self.assertLess(used, 0.2)

    def test_async_collector_failing(self):
        """The collector thread stopped by an error of its own: the requests
        it watched fail with InternalError at once rather than hang, and
        the next prediction starts a collector anew."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        net = mlp(5)
        gate = self.gated(net)
        c = self.client()
        real = _bell.wait_any

        def broken(words, until, arr):
            _bell.wait_any = real
            raise MemoryError("the collector's own failure")

        _bell.wait_any = broken
        self.addCleanup(setattr, _bell, "wait_any", real)
        with self.assertLogs("tensorwire.serve", "ERROR") as logs:
            fut = c.predict_async(obs(1), timeout=60)
            with self.assertRaisesRegex(tensorwire.InternalError, "the collector's own failure"):
                fut.result(10)
        self.assertIn("collector of predictions by bell failed", logs.output[0])
        gate.set()
        wait_until(lambda: c._free.free == [(0, 32)], what="the failed requests' slots given back")
        x = obs(4, seed=9)
        want = direct(net, x)
        np.testing.assert_array_equal(c.predict_async(x, timeout=60).result(60)["logits"], want)

    def test_call_collector_failing(self):
        """The same for asynchronous predictions by call (without
        futex_waitv): the collector of their responses stopped by an error
        of its own fails its requests with InternalError, keeps their slots
        the second a canceled call's are kept, and the next prediction
        starts a collector anew."""
        from tensorwire import _yamux

        saved = _bell._waitv_ok
        _bell._waitv_ok = False
        self.addCleanup(setattr, _bell, "_waitv_ok", saved)
        net = mlp(6)
        gate = self.gated(net)
        c = self.client()
        real = _yamux.Session.wait

        def broken(sess, pred, deadline):
            if threading.current_thread().name != "tensorwire-serve-collector":
                return real(sess, pred, deadline)  # a send waiting for its window
            _yamux.Session.wait = real
            raise MemoryError("the call collector's own failure")

        _yamux.Session.wait = broken
        self.addCleanup(setattr, _yamux.Session, "wait", real)
        with self.assertLogs("tensorwire.serve", "ERROR") as logs:
            fut = c.predict_async(obs(2), timeout=60)
            with self.assertRaisesRegex(tensorwire.InternalError, "the call collector's own failure"):
                fut.result(10)
        self.assertIn("collector of asynchronous predictions failed", logs.output[0])
        self.assertEqual(c._free.free, [(2, 30)])  # the canceled call's rows, kept a second
        wait_until(lambda: c._free.free == [(0, 32)], what="the canceled call's slots given back")
        gate.set()
        x = obs(4, seed=9)
        want = direct(net, x)
        np.testing.assert_array_equal(c.predict_async(x, timeout=60).result(60)["logits"], want)

    def test_push_after_registering_again_is_sent_once(self):
        """The client registers again between a predict reading the
        registration it waits under and its push (_RegisterFirst): the
        push finds it registered again and the request reads the new
        registration and pushes once; the replica holds its batch, so a
        request pushed twice would show in the ring's tail. Before the fix
        the push appended under the new registration, the request then saw
        the registration changed and pushed it again: two entries, the
        request run twice."""
        self.push_once(lambda c, x: c.predict(x, timeout=60))

    def test_async_push_after_registering_again_is_sent_once(self):
        """The same for predict_async (the bell collector saw the
        registration changed and pushed it again)."""
        if not _bell.waitv_supported():
            self.skipTest("this kernel has no futex_waitv: asynchronous predictions go by call")
        self.push_once(lambda c, x: c.predict_async(x, timeout=60).result(60))

    def push_once(self, predict):
        net = mlp(7)
        gate = self.gated(net)
        c = self.client()
        ring, regs = c._ring, c.registrations
        tail = ring.q[0]
        hook = _RegisterFirst(c)
        ring.mu = hook
        x = obs(2, seed=3)
        got = []
        t = threading.Thread(target=lambda: got.append(predict(c, x)))
        t.start()
        wait_until(lambda: ring.q[0] != tail, what="the request pushed")
        time.sleep(0.5)  # a second push would come at once
        pushed = ring.q[0] - tail
        gate.set()
        t.join(60)
        ring.mu = hook.real
        self.assertTrue(hook.fired)
        self.assertEqual(pushed, 1)
        self.assertEqual(c.registrations, regs + 1)
        np.testing.assert_array_equal(got[0]["logits"], direct(net, x))

    def test_close_fails_async_predictions(self):
        self.gated(lambda x: torch.zeros(x.shape[0], 16))
        c = self.client()
        futs = [c.predict_async(obs(1, seed=i), timeout=60) for i in range(4)]
        time.sleep(0.3)
        t0 = time.monotonic()
        c.close()
        for f in futs:
            with self.assertRaises(serve.ClosedError):
                f.result(5)
        self.assertLess(time.monotonic() - t0, 5)

    def test_close_wakes_a_waiting_predict(self):
        self.gated(lambda x: torch.zeros(x.shape[0], 16))
        c = self.client()
        got = []

        def run():
            try:
                c.predict(obs(1), timeout=60)
            except BaseException as e:  # noqa: BLE001
                got.append(e)

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        c.close()
        t.join(10)
        self.assertFalse(t.is_alive())
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(len(got), 1)
        self.assertIsInstance(got[0], serve.ClosedError)


if __name__ == "__main__":
    unittest.main()
