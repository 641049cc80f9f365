"""The store client against real Go nodes: bins, Get in two phases,
parameters with leases, watches (across a node restart), in both modes."""

import threading
import unittest

import numpy as np

import tensorwire
from tensorwire import store

from nodes import TOKEN, Node, wait_until

MODES = ("ref", "bytes")


def dial(node, mode):
    return store.Store(node.addr, "main", token=TOKEN, root=node.root, bytes_mode=mode == "bytes")


def item(i, n=4):
    return {"obs": np.full((n, 3), i, np.float32), "id": np.array(i, np.int64), "meta": {"step": np.arange(n)}}


class TestStore(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node(extra=["--store", "main"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def test_bins(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as s:
                self.assertEqual((s.mode, s.sharing), (mode, "coherent"))
                b = "bin-" + mode
                r1 = s.put(b, item(1))
                r2 = s.append(b, item(2))
                self.assertGreater(r2, r1)
                items = s.peek(b)
                self.assertEqual([int(x["id"]) for x in items], [1, 2])
                np.testing.assert_array_equal(items[1]["obs"], item(2)["obs"])
                np.testing.assert_array_equal(items[0]["meta"]["step"], np.arange(4))
                bins, rev = s.list()
                self.assertEqual(bins[b], 2)
                self.assertGreaterEqual(rev, r2)
                got = s.get(b)
                self.assertEqual([int(x["id"]) for x in got], [1, 2])
                self.assertEqual(s.get(b), [])
                self.assertNotIn(b, s.list()[0])
                s.put(b, item(3))
                s.delete(b)
                self.assertEqual(s.peek(b), [])

    def test_extend(self):
        """extend adds its values in order as one operation: one revision,
        one event; a refused extend adds none of them."""
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as s:
                b = "extend-" + mode
                r0 = s.append(b, item(0))
                r = s.extend(b, [item(1), item(2, n=1 << 17), item(3)])  # 2: 2.5 MiB, a prefix on the node
                self.assertEqual(r, r0 + 1)
                self.assertEqual([int(x["id"]) for x in s.peek(b)], [0, 1, 2, 3])
                with s.watch(b, after=r0, timeout=30) as w:
                    e = next(iter(w))
                self.assertEqual((e.rev, e.op, e.name, e.items), (r, "append", b, 4))
                for bad in ([], [item(4), "not a dict"], [item(4)] * 4097):
                    with self.assertRaises(store.FormatError):
                        s.extend(b, bad)
                saved, store._MAX_LOGGED = store._MAX_LOGGED, 1000
                try:
                    with self.assertRaises(store.TooLargeError):
                        s.extend(b, [item(4, n=100), item(5, n=100)])  # 1,200 + 800 bytes each: to the log
                finally:
                    store._MAX_LOGGED = saved
                self.assertEqual(s.list()[0][b], 4)
                self.assertEqual([int(x["id"]) for x in s.get(b)], [0, 1, 2, 3])

    def test_get_past_its_timeout_after_the_reply_loses_nothing(self):
        """A get whose timeout passes between the node's reply and the
        acknowledgement still returns its items (they were removed for it);
        before, it raised and the node held them for its get-timeout."""
        import time
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as s:
                b = "late-" + mode
                for i in range(3):
                    s.append(b, item(i))
                store._test_after_take = lambda: time.sleep(0.6)
                try:
                    got = s.get(b, timeout=0.5)
                finally:
                    store._test_after_take = None
                self.assertEqual([int(x["id"]) for x in got], [0, 1, 2])
                self.assertEqual(s.get(b), [])

    def test_get_that_gives_up_unreachable_gives_its_take_back(self):
        """A get whose take gives up at its deadline with UnavailableError
        (the reply lost, the node unreachable since) gives the items the
        node may hold for it back at once, as Go's Client.Get does once
        its ctx is done: the next get has them. Before the fix only a
        DeadlineExceededError gave them back, and the node hid them for its
        30 s get-timeout."""
        with dial(self.node, "bytes") as s:
            b = "lost-take"
            for i in range(2):
                s.append(b, item(i))
            real = s._client.call
            takes = []

            def reply_lost(method, arg=None, **kw):
                r = real(method, arg, **kw)  # the node holds the items for the take
                if method == "store.take" and arg.get("take"):
                    takes.append(arg["take"])
                    raise tensorwire.UnavailableError("connection to the node broken (a test's)")
                return r

            s._client.call = reply_lost
            try:
                with self.assertRaises(tensorwire.UnavailableError):
                    s.get(b, timeout=0.3)
            finally:
                del s._client.call
            self.assertTrue(takes)
            self.assertEqual([int(x["id"]) for x in s.get(b, timeout=5)], [0, 1])

    def test_peek_of_an_item_removed_meanwhile(self):
        """A peek by reference whose item a get removes between the node's
        answer and its mapping peeks again (as Go's Client.Peek does);
        before, it raised FormatError ("meta.json is missing")."""
        big = {"x": np.arange(2 << 20, dtype=np.float32)}  # a prefix, not inline
        with dial(self.node, "ref") as s, dial(self.node, "ref") as other:
            s.put("gone", big)

            def get_it():
                store._test_before_map = None
                self.assertEqual(len(other.get("gone")), 1)

            store._test_before_map = get_it
            try:
                self.assertEqual(s.peek("gone"), [])
            finally:
                store._test_before_map = None

    def test_large_values_by_reference(self):
        big = {"x": np.arange(2 << 20, dtype=np.float32)}  # 8 MiB: a prefix, not inline
        with dial(self.node, "ref") as s, dial(self.node, "bytes") as y:
            s.put("big", big)
            a = s.peek("big")[0]["x"]
            self.assertIsInstance(a, np.memmap)
            np.testing.assert_array_equal(a, big["x"])
            b = y.get("big")[0]["x"]
            self.assertNotIsInstance(b, np.memmap)
            np.testing.assert_array_equal(b, big["x"])

    def test_parameters(self):
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as s:
                name = "params-" + mode
                with self.assertRaises(store.NotFoundError):
                    s.latest(name)
                v1 = s.publish(name, {"w": np.ones((3, 3), np.float32)})
                got = []
                t = threading.Thread(target=lambda: got.append(s.wait_newer(name, v1, timeout=60)))
                t.start()
                v2 = s.publish(name, {"w": np.full((3, 3), 2, np.float32)})
                t.join(60)
                self.assertEqual((v1, v2), (1, 2))
                with got[0] as p:
                    self.assertEqual(p.version, 2)
                    self.assertTrue((p.td["w"] == 2).all())
                with s.latest(name) as p:
                    self.assertEqual(p.version, 2)
                    if mode == "ref":
                        self.assertIsInstance(p.td["w"], np.memmap)
                        self.assertTrue(p.lease)
                    self.assertIsNone(p.err)
                with self.assertRaises(tensorwire.DeadlineExceededError):
                    s.wait_newer(name, 2, timeout=0.3)

    def test_parameters_into(self):
        """latest and wait_newer with into: by bytes each version is read into
        the follower's arrays when they fit (the Param's td is that very
        dict), into new arrays when they do not (the follower's untouched);
        by reference td maps the version and into is not written."""
        for mode in MODES:
            with self.subTest(mode=mode), dial(self.node, mode) as s:
                name = "params-into-" + mode
                v1 = s.publish(name, {"w": np.ones((3, 3), np.float32), "b": {"x": np.arange(4, dtype=np.int64)}})
                buf = {"w": np.zeros((3, 3), np.float32), "b": {"x": np.zeros(4, np.int64)}}
                w = buf["w"]
                with s.latest(name, into=buf) as p:
                    self.assertEqual(p.version, v1)
                    self.assertTrue((p.td["w"] == 1).all())
                    np.testing.assert_array_equal(p.td["b"]["x"], np.arange(4))
                    if mode == "bytes":
                        self.assertIs(p.td, buf)
                        self.assertIs(p.td["w"], w)
                    else:
                        self.assertIsInstance(p.td["w"], np.memmap)
                        self.assertFalse(w.any(), "by reference the follower's arrays were written")
                got = []
                t = threading.Thread(target=lambda: got.append(s.wait_newer(name, v1, timeout=60, into=buf)))
                t.start()
                v2 = s.publish(name, {"w": np.full((3, 3), 2, np.float32), "b": {"x": np.arange(4, dtype=np.int64) * 3}})
                t.join(60)
                with got[0] as p:
                    self.assertEqual(p.version, v2)
                    self.assertTrue((p.td["w"] == 2).all())
                    if mode == "bytes":
                        self.assertIs(p.td, buf)
                        self.assertTrue((w == 2).all())
                other = {"w": np.zeros((3, 3), np.float64), "b": {"x": np.zeros(4, np.int64)}}  # another dtype
                with s.latest(name, into=other) as p:
                    self.assertIsNot(p.td, other)
                    self.assertTrue((p.td["w"] == 2).all())
                    self.assertFalse(other["w"].any() or other["b"]["x"].any(), "a buffer that does not fit was written")

    def test_names_refused_before_sending(self):
        with dial(self.node, "bytes") as s:
            for bad in ["", ".", "..", "a/b", "a\\b", "x\x00", "x" * 256]:
                with self.assertRaises(store.NameError_):
                    s.append(bad, item(1))
            self.assertIsInstance(store.NameError_("x"), tensorwire.InvalidArgumentError)

    def test_watch(self):
        with dial(self.node, "bytes") as s:
            _, rev = s.list()
            with s.watch("w-", after=rev, timeout=60) as w:
                s.put("w-a", item(1))
                s.append("w-a", item(2))
                s.append("other", item(3))  # not under the prefix
                s.get("w-a")
                s.put("w-b", item(4))
                s.delete("w-b")
                s.publish("w-p", {"w": np.zeros(2)})
                evs = [next(w) for _ in range(6)]
            self.assertEqual([(e.op, e.name, e.items) for e in evs],
                             [("put", "w-a", 1), ("append", "w-a", 2), ("get", "w-a", 0), ("put", "w-b", 1),
                              ("delete", "w-b", 0), ("publish", "w-p", 0)])
            self.assertEqual(evs[-1].version, 1)
            revs = [e.rev for e in evs]
            self.assertEqual(revs, sorted(revs))
            self.assertGreater(revs[0], rev)

    def test_watch_closed_while_waiting(self):
        """A watch closed from another thread while its iteration waits for
        an event ends the iteration; it does not raise."""
        with dial(self.node, "bytes") as s:
            _, rev = s.list()
            w = s.watch("nothing-here-", after=rev, timeout=60)
            out = []

            def follow():
                try:
                    out.extend(w)
                    out.append("ended")
                except Exception as e:  # noqa: BLE001
                    out.append(e)

            t = threading.Thread(target=follow, daemon=True)
            t.start()
            wait_until(lambda: w._stream is not None, what="the watch waiting on its stream")
            w.close()
            t.join(30)
            self.assertFalse(t.is_alive(), "the iteration did not end")
            self.assertEqual(out, ["ended"])

    def test_watch_of_a_closed_store_raises_closed(self):
        """A watch of a Store that is closed (and its client with it) raises
        store.ClosedError, as the Store's calls do, whether it had yet to
        open its stream or waited on it. Before the fix it took the closed
        client's ClientClosedError (an UnavailableError) for the node
        restarting and opened the stream again, with backoff, for good
        (timeout None)."""
        for waiting in (False, True):
            with self.subTest(waiting=waiting):
                s = dial(self.node, "bytes")
                _, rev = s.list()
                w = s.watch("closed-", after=rev)
                out = []

                def follow():
                    try:
                        out.extend(w)
                        out.append("ended")
                    except Exception as e:  # noqa: BLE001
                        out.append(e)

                t = threading.Thread(target=follow, daemon=True)
                if waiting:
                    t.start()
                    wait_until(lambda: w._stream is not None, what="the watch waiting on its stream")
                s.close()
                if not waiting:
                    t.start()
                t.join(10)
                w.close()  # ends a watch still running
                self.assertFalse(t.is_alive(), "the closed store's watch still running after 10 s")
                self.assertEqual(len(out), 1, out)
                self.assertIsInstance(out[0], store.ClosedError, out)

    def test_watch_compacted(self):
        with dial(self.node, "bytes") as s:
            _, rev = s.list()
            with self.assertRaises(store.CompactedError):
                next(s.watch("", after=rev + 1000, timeout=30))


class TestStoreNodeRestarted(unittest.TestCase):
    def test_watch_resumes_and_appends_once(self):
        """A watcher and a writer through a kill -9 of the node: the watcher
        sees every revision once, in order; every acknowledged append is in
        the bin once."""
        with Node(extra=["--store", "main"]) as node:
            s = store.Store(node.addr, "main", token=TOKEN, root=node.root)
            w = store.Store(node.addr, "main", token=TOKEN, root=node.root)
            _, rev = s.list()
            watch = w.watch("", after=rev, timeout=120)
            seen = []
            errs = []

            def follow():
                try:
                    for ev in watch:
                        seen.append(ev)
                except Exception as e:  # noqa: BLE001
                    errs.append(e)

            t = threading.Thread(target=follow, daemon=True)
            t.start()
            acked = []
            for i in range(1, 11):
                acked.append((i, s.append("data", {"id": np.array(i)}, timeout=60)))
            node.kill()
            node.start()
            for i in range(11, 21):
                acked.append((i, s.append("data", {"id": np.array(i)}, timeout=120)))
            wait_until(lambda: len(seen) >= 20 or errs, what="the watcher sees 20 events")
            watch.close()
            self.assertEqual(errs, [])
            self.assertEqual([e.rev for e in seen[:20]], [r for _, r in acked])
            ids = [int(x["id"]) for x in s.peek("data")]
            self.assertEqual(sorted(ids), list(range(1, 21)))
            s.close()
            w.close()


if __name__ == "__main__":
    unittest.main()
