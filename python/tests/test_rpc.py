"""The rpc client against real Go nodes: the handshake, calls, TensorDicts by
reference and by bytes, errors, deadlines, a node killed, silent or idle."""

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import unittest

import numpy as np

import tensorwire
from tensorwire import _lz4, _msgpack, _wire
from tensorwire._td import TD

from nodes import REPO, TOKEN, HandlerNode, Node, ScriptedNode, binary, wait_until

GOLDEN = os.path.join(REPO, "tensordict", "testdata", "golden")


class TestHandshake(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node().start()
        cls.open = Node(token=None).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()
        cls.open.close()

    def test_token(self):
        with tensorwire.Client(self.node.addr, token=TOKEN) as c:
            self.assertIn("peers", c.stats())
            self.assertFalse(c.shared_fs())

    def test_token_str_and_file(self):
        with tensorwire.Client(self.node.addr, token=TOKEN.decode()) as c:
            c.stats()
        with tensorwire.Client(self.node.addr, token=tensorwire.read_token(self.node.token_file)) as c:
            c.stats()

    def test_wrong_token(self):
        with self.assertRaises(tensorwire.UnauthenticatedError) as cm:
            tensorwire.Client(self.node.addr, token=b"not the token")
        self.assertIn("wrong token", str(cm.exception))

    def test_no_token(self):
        with self.assertRaises(tensorwire.UnauthenticatedError) as cm:
            tensorwire.Client(self.node.addr)
        self.assertIn("requires a token", str(cm.exception))

    def test_token_for_a_node_without_one(self):
        """A client with a token refuses a node that cannot prove it knows it;
        the node refuses first."""
        with self.assertRaises(tensorwire.UnauthenticatedError):
            tensorwire.Client(self.open.addr, token=TOKEN)
        with tensorwire.Client(self.open.addr) as c:
            c.stats()

    def test_not_a_node(self):
        """A peer that does not speak the protocol: Unavailable."""
        import socket
        ls = socket.socket()
        ls.bind(("127.0.0.1", 0))
        ls.listen(1)

        def serve():
            c, _ = ls.accept()
            c.recv(64)
            c.sendall(b"HTTP/1.1 400 Bad Request\r\n" + b"x" * 64)
            c.close()

        threading.Thread(target=serve, daemon=True).start()
        with self.assertRaises(tensorwire.UnavailableError) as cm:
            tensorwire.Client("127.0.0.1:%d" % ls.getsockname()[1], timeout=10)
        self.assertIn("magic", str(cm.exception))
        ls.close()

    def test_root_not_a_folder(self):
        with self.assertRaises(tensorwire.InvalidArgumentError):
            tensorwire.Client(self.node.addr, token=TOKEN, root=os.path.join(self.node.dir, "no-such-root"))

    def test_nobody_listening(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        addr = "127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        with self.assertRaises(tensorwire.UnavailableError):
            tensorwire.Client(addr, timeout=5)


def copy_of_root(node):
    """A folder holding a copy of the node's root identity, as cp -a of the
    root makes one: the same .tensorwire-fsid, other files."""
    d = tempfile.mkdtemp(prefix="tensorwire-pytest-copy-")
    shutil.copy(os.path.join(node.root, ".tensorwire-fsid"), d)
    return d


class TestSharing(unittest.TestCase):
    """Version 4's where messages with a real node: the level a client with
    the node's root, a copy of it, another root or none decides."""

    @classmethod
    def setUpClass(cls):
        cls.node = Node().start()
        # The node's identity exists once a client with its root connected.
        with tensorwire.Client(cls.node.addr, token=TOKEN, root=cls.node.root) as c:
            c.stats()
        cls.tmp = tempfile.mkdtemp(prefix="tensorwire-pytest-sharing-")

    @classmethod
    def tearDownClass(cls):
        cls.node.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def level(self, root):
        """The sharing a client with root gets. It makes a call, whose
        answer comes once the node is done with the where messages and has
        removed its probe: the client's side ends a step before the node's,
        so a client closed at once may leave the node still holding it."""
        with tensorwire.Client(self.node.addr, token=TOKEN, root=root) as c:
            c.stats()
            return c.sharing(), c.shared_fs(), c._connection(None).why

    def test_the_node_s_root(self):
        self.assertEqual(self.level(self.node.root)[:2], (tensorwire.Sharing.COHERENT, True))
        link = os.path.join(self.tmp, "link")
        os.symlink(self.node.root, link)
        self.assertEqual(self.level(link)[:2], ("coherent", True))

    def test_a_copy_of_the_root(self):
        """Equal identities, but the node's probe is not under the copy: none."""
        d = copy_of_root(self.node)
        try:
            level, shared, why = self.level(d)
            self.assertEqual((level, shared), (tensorwire.Sharing.NONE, False))
            self.assertIn("probe", why)
        finally:
            shutil.rmtree(d)

    def test_other_roots(self):
        other = tempfile.mkdtemp(prefix="tensorwire-pytest-other-")
        try:
            self.assertEqual(self.level(other)[:2], ("none", False))
        finally:
            shutil.rmtree(other)
        self.assertEqual(self.level(None)[:2], ("none", False))

    def test_no_probe_left_behind(self):
        """Once a connection is up (its first answer), the node's probe for
        it is gone, whatever level the client decided."""
        self.level(self.node.root)
        d = copy_of_root(self.node)
        try:
            self.level(d)
        finally:
            shutil.rmtree(d)
        probes = os.path.join(self.node.root, ".tensorwire-probe")
        self.assertEqual(os.listdir(probes) if os.path.isdir(probes) else [], [])

    def test_logged_once(self):
        """A client with a root that is not coherent says why, once per
        reason (at INFO, logger "tensorwire"); a coherent one says nothing
        at INFO."""
        d = copy_of_root(self.node)
        try:
            with self.assertLogs("tensorwire", "INFO") as cm:
                with tensorwire.Client(self.node.addr, token=TOKEN, root=d) as c:
                    c.stats()  # answered: the node is done with this connection's probe
                    c._connection(None).session.close()
                    c.stats()  # a second connection, the same reason
                    self.assertEqual(c.connections, 2)
            self.assertEqual(len(cm.records), 1, cm.output)
            self.assertIn("sharing none", cm.output[0])
            self.assertIn("probe", cm.output[0])
        finally:
            shutil.rmtree(d)
        with self.assertLogs("tensorwire", "DEBUG") as cm:
            self.level(self.node.root)
        self.assertEqual([r.levelname for r in cm.records], ["DEBUG"])


class TestOlderNodes(unittest.TestCase):
    """A node of version 3 or 2 gets a second dial in its version, without
    where messages: equal identities are taken as coherent, as those
    versions did."""

    def test_fallback(self):
        root = tempfile.mkdtemp(prefix="tensorwire-pytest-old-")
        try:
            fsid = tensorwire._wire.read_fsid(root)
            for newest in (3, 2):
                with self.subTest(newest=newest):
                    old = ScriptedNode(newest=newest, fsid=fsid)
                    try:
                        with tensorwire.Client(old.addr, root=root) as c:
                            conn = c._connection(None)
                            self.assertEqual((conn.version, c.sharing(), c.shared_fs()), (newest, "coherent", True))
                        with tensorwire.Client(old.addr) as c:
                            self.assertEqual(c.sharing(), "none")
                        self.assertEqual(old.hellos, [4, newest, 4, newest])
                    finally:
                        old.close()
        finally:
            shutil.rmtree(root)


class TestCalls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node(buffers=["empty,capacity=16"]).start()
        shutil.copytree(os.path.join(GOLDEN, "basic_orjson"), os.path.join(cls.node.root, "ds"))
        cls.c = tensorwire.Client(cls.node.addr, token=TOKEN, root=cls.node.root)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.node.close()

    def test_shared(self):
        self.assertTrue(self.c.shared_fs())

    def test_version4(self):
        """The client speaks version 4 with a node that does (and asks for
        uncompressed bodies, which the bulk test reads)."""
        self.assertEqual(self.c._connection(None).version, 4)

    def test_describe_and_read(self):
        d = self.c.describe("ds")
        local = tensorwire.load_memmap(os.path.join(self.node.root, "ds"))
        self.assertEqual(d["batch"], [local["obs"].shape[0]])
        self.assertEqual([f["key"] for f in d["fields"]][:3], [["obs"], ["action"], ["done"]])
        td = self.c.read("ds")
        np.testing.assert_array_equal(td["obs"], local["obs"])
        np.testing.assert_array_equal(td["next"]["reward"], local["next"]["reward"])
        td = self.c.read("ds", rows=[1, 0])
        np.testing.assert_array_equal(td["obs"], local["obs"][[1, 0]])

    def test_call_into(self):
        """into: a result TensorDict read into the caller's arrays when they
        fit, the result then holding that very dict; into new arrays, the
        caller's left as they were, when not (a dtype, a shape, a key, a
        non-contiguous array)."""
        local = tensorwire.load_memmap(os.path.join(self.node.root, "ds"))

        def zeros_like(td):
            return {k: zeros_like(v) if isinstance(v, dict) else np.zeros_like(np.asarray(v)) for k, v in td.items()}

        def read_into(dst):
            return self.c.call("tensorwire.read", {"prefix": "ds", "rows": [1, 0], "into": None},
                               result_tds=("td",), into={"td": dst})["td"]

        want = self.c.read("ds", rows=[1, 0])
        dst = zeros_like(want)
        obs = dst["obs"]
        got = read_into(dst)
        self.assertIs(got, dst)
        self.assertIs(got["obs"], obs)
        np.testing.assert_array_equal(got["obs"], local["obs"][[1, 0]])
        np.testing.assert_array_equal(got["next"]["reward"], local["next"]["reward"][[1, 0]])

        def other_dtype(d):
            d["action"] = d["action"].astype(np.float64)

        def other_shape(d):
            d["obs"] = np.zeros((3,) + d["obs"].shape[1:], d["obs"].dtype)

        def a_key_more(d):
            d["extra"] = np.zeros(2)

        def a_key_less(d):
            del d["next"]["reward"]

        def strided(d):
            d["obs"] = np.zeros(d["obs"].shape[::-1], d["obs"].dtype).T

        for change in (other_dtype, other_shape, a_key_more, a_key_less, strided):
            with self.subTest(change.__name__):
                dst = zeros_like(want)
                change(dst)
                got = read_into(dst)
                self.assertIsNot(got, dst)
                np.testing.assert_array_equal(got["obs"], local["obs"][[1, 0]])
                self.assertFalse(dst["obs"].any(), "the caller's arrays were written")

    def test_errors_by_code(self):
        with self.assertRaises(tensorwire.NotFoundError):
            self.c.describe("no/such/prefix")
        with self.assertRaises(tensorwire.PermissionDeniedError):
            self.c.describe("../outside")
        with self.assertRaises(tensorwire.TensorwireError) as cm:
            self.c.call("no.such.method", {})
        self.assertEqual(cm.exception.code_name, "Unimplemented")
        with self.assertRaises(tensorwire.replay.NotFoundError) as cm:
            self.c.call("replay.info", {"name": "nope"})
        self.assertEqual(cm.exception.reason, "replay.not_found")
        self.assertIsInstance(cm.exception, tensorwire.NotFoundError)
        # The stream survives an error: the next call on it works.
        self.assertIn("peers", self.c.stats())

    def test_deadline(self):
        """A sample of an empty buffer waits; its timeout ends it, on the node
        too (DeadlineExceeded)."""
        t0 = time.monotonic()
        with self.assertRaises(tensorwire.DeadlineExceededError):
            self.c.call("replay.sample", {"name": "empty", "n": 1, "bytes": False}, timeout=0.3)
        self.assertLess(time.monotonic() - t0, 30)
        self.assertIn("peers", self.c.stats())

    def test_cancel(self):
        p = self.c.start("replay.sample", {"name": "empty", "n": 1, "bytes": False})
        p.cancel()
        with self.assertRaises(tensorwire.TensorwireError) as cm:
            p.result()
        self.assertEqual(cm.exception.code_name, "Canceled")
        self.assertIn("peers", self.c.stats())

    def test_concurrent(self):
        errs = []

        def work():
            try:
                for _ in range(30):
                    self.c.describe("ds")
            except Exception as e:  # noqa: BLE001
                errs.append(e)

        ts = [threading.Thread(target=work) for _ in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])

    def test_idle_stream(self):
        """A stream idle over a second is checked before it is reused."""
        self.c.stats()
        time.sleep(1.2)
        self.assertIn("peers", self.c.stats())

    def test_bulk_bytes(self):
        """40 MB each way, beyond the 16 MiB window and the first 256 KiB."""
        with tensorwire.Client(self.node.addr, token=TOKEN) as c:
            src = os.path.join(self.node.dir, "big.npy")
            a = np.random.default_rng(1).integers(0, 255, size=(40, 1000, 1000), dtype=np.uint8)
            np.save(src, a)
            r = subprocess.run([binary(), "import", "npy", "x=" + src, os.path.join(self.node.root, "big")],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            td = c.read("big")
            np.testing.assert_array_equal(td["x"], a)
            # And up: a fill by bytes of all rows comes back.
            mine = {"x": a.copy()}
            self.assertEqual(c.fill(mine, 3.0), 40)
            self.assertTrue((mine["x"] == 3).all())

    def test_fill_by_reference(self):
        """A TD under the shared root travels as a reference: the node writes
        into the file this side maps."""
        path = os.path.join(self.node.root, "ref.memmap")
        mm = np.memmap(path, dtype=np.float32, mode="w+", shape=(6, 4))
        n = self.c.fill({"t": mm}, 2.5, rows=[1, 4])
        self.assertEqual(n, 2)
        self.assertTrue((mm[[1, 4]] == 2.5).all())
        self.assertTrue((mm[[0, 2, 3, 5]] == 0).all())

    def test_fill_by_bytes_rows(self):
        a = np.zeros((5, 3), dtype=np.int16)
        with tensorwire.Client(self.node.addr, token=TOKEN) as c:
            self.assertEqual(c.fill({"a": a, "n": {"b": np.zeros(5, np.float64)}}, 9, rows=[4, 0]), 2)
        self.assertTrue((a[[0, 4]] == 9).all() and (a[1:4] == 0).all())


class TestNodeFailures(unittest.TestCase):
    def test_killed_and_restarted(self):
        """A call to a killed node is Unavailable; once it is back on the same
        address the client dials again by itself."""
        with Node() as node:
            c = tensorwire.Client(node.addr, token=TOKEN)
            c.stats()
            node.kill()
            with self.assertRaises(tensorwire.UnavailableError):
                c.stats(timeout=10)
            node.start()
            self.assertIn("peers", wait_until(lambda: _try(c.stats), what="the client reconnects"))
            self.assertEqual(c.connections, 2)
            c.close()
            with self.assertRaises(tensorwire.ClientClosedError):
                c.stats()

    def test_silent_node(self):
        """A node that stops answering (SIGSTOP: its socket stays open) is
        taken for gone after 5 keep-alive intervals: Unavailable, not a hang."""
        with Node() as node:
            c = tensorwire.Client(node.addr, token=TOKEN, keepalive=0.2)
            c.stats()
            os.kill(node.proc.pid, signal.SIGSTOP)
            # kill returns before the node stops: wait until it has (state T),
            # or it may still answer the next call.
            wait_until(lambda: _state(node.proc.pid) == "T", what="the node stopped")
            try:
                t0 = time.monotonic()
                with self.assertRaises(tensorwire.UnavailableError) as cm:
                    c.stats()
                self.assertIn("silent", str(cm.exception))
                self.assertLess(time.monotonic() - t0, 60)
            finally:
                os.kill(node.proc.pid, signal.SIGCONT)
            self.assertIn("peers", wait_until(lambda: _try(c.stats), what="the client reconnects"))
            c.close()


class TestStreamTimeouts(unittest.TestCase):
    """recv(timeout=) on a message stream whose node sends a message in two
    parts, the second after the timeout: the recv that times out leaves the
    stream as it was, and the next recv gets the message whole (as Go's
    Stream.Recv does when its context ends)."""

    X = np.arange(300, dtype=np.uint8)

    @staticmethod
    def handler(node, c, sid, hdr, arg, body):
        """Sends the messages arg["messages"] names ("good": one of X,
        "bad": one whose dtype is no dtype, "lz4": X as an LZ4 frame), then
        the end, cut after arg["cut"] bytes for half a second."""
        out = b""
        for kind in arg["messages"]:
            t = TD({"x": TestStreamTimeouts.X})
            t.prepare(None)
            if kind == "bad":
                t.wire["entries"][0]["dtype"] = "torch.nope"
            raw, b = _msgpack.packb({"td": t.wire}), t.parts[0].tobytes()
            raw_len = 0
            if kind == "lz4":
                import lz4.frame
                b, raw_len = lz4.frame.compress(b), len(b)
            out += _wire.stream_message_header(len(raw), len(b), raw_len) + raw + b
        out += _wire.stream_end_header(0)
        node.send(c, sid, out[:arg["cut"]])
        time.sleep(0.5)
        node.send(c, sid, out[arg["cut"]:])

    def test_recv_timeout_in_the_middle_of_a_message(self):
        """The message is cut in its frame's length, its header, its
        argument and its body (into the caller's arrays with into, an LZ4
        body too): the recv that times out raises DeadlineExceededError, the
        next returns the message, the one after that StreamEnd, all on the
        one connection. Before the fix the bytes the timed-out recv had
        read were lost, and the next recv read the rest of the message as
        a frame header: a ProtocolError that failed the whole connection."""
        t = TD({"x": self.X})
        t.prepare(None)
        head = len(_wire.stream_message_header(1, 1)) + len(_msgpack.packb({"td": t.wire}))
        cases = [(cut, into, "good") for cut in (2, 7, head - 2, head + 100) for into in (False, True)]
        if _lz4.available():
            cases.append((head + 10, False, "lz4"))
        node = HandlerNode(self.handler)
        try:
            with tensorwire.Client(node.addr, timeout=10, compression=_lz4.available()) as c:
                for cut, into, kind in cases:
                    with self.subTest(cut=cut, into=into, kind=kind):
                        dst = {"x": np.zeros_like(self.X)}
                        kw = {"into": {"td": dst}} if into else {}
                        ms = c.open_stream("liar.watch", {"messages": [kind], "cut": cut}, timeout=30,
                                           result_tds=("td",))
                        with self.assertRaises(tensorwire.DeadlineExceededError):
                            ms.recv(timeout=0.2, **kw)
                        got = ms.recv(timeout=10, **kw)
                        np.testing.assert_array_equal(got["td"]["x"], self.X)
                        if into:
                            self.assertIs(got["td"], dst)
                        with self.assertRaises(tensorwire.rpc.StreamEnd):
                            ms.recv(timeout=10)
                        ms.close()
                self.assertEqual(c.connections, 1)
        finally:
            node.close()

    def test_recv_timeout_while_a_bad_message_is_skipped(self):
        """A message this client cannot decode, cut in its body: the recv
        that times out raises DeadlineExceededError, the next one the
        message's InternalError (the rest of its body skipped), and the
        stream goes on with the next message."""
        t = TD({"x": self.X})
        t.prepare(None)
        t.wire["entries"][0]["dtype"] = "torch.nope"
        head = len(_wire.stream_message_header(1, 1)) + len(_msgpack.packb({"td": t.wire}))
        node = HandlerNode(self.handler)
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                ms = c.open_stream("liar.watch", {"messages": ["bad", "good"], "cut": head + 100}, timeout=30,
                                   result_tds=("td",))
                with self.assertRaises(tensorwire.DeadlineExceededError):
                    ms.recv(timeout=0.2)
                with self.assertRaises(tensorwire.InternalError):
                    ms.recv(timeout=10)
                np.testing.assert_array_equal(ms.recv(timeout=10)["td"]["x"], self.X)
                with self.assertRaises(tensorwire.rpc.StreamEnd):
                    ms.recv(timeout=10)
                ms.close()
                self.assertEqual(c.connections, 1)
        finally:
            node.close()


def _state(pid):
    """The process's state letter from /proc (T: stopped)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _try(f):
    try:
        return f()
    except tensorwire.UnavailableError:
        return None


if __name__ == "__main__":
    unittest.main()
