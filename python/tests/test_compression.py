"""Bodies by bytes as LZ4 frames (docs/protocol.md, "Compression") between a
real Go node and the Python client made with compression=True (which needs
the lz4 package): a call's response and a stream's messages come compressed
when they compress, and intact; a client made without it is sent them as
they are; a malformed frame is an InternalError and the connection goes
on; a frame said to inflate past the limit fails the connection before
anything is allocated."""

import unittest

import numpy as np

from tensorwire import _lz4, _wire, loader, replay, rpc
from tensorwire.errors import InternalError, InvalidArgumentError

from nodes import TOKEN, CountingProxy, Node, ScriptedNode, binary

try:
    import lz4.frame as lz4frame
except ImportError:
    lz4frame = None

NEEDS_LZ4 = "the lz4 package is not installed here (PyPI's lz4, Debian's python3-lz4): compression=True is refused"


def frames(ids, h=84, w=84):
    """Atari-like observations: a constant background and a moving block,
    so that they compress as real ones do (a few times)."""
    ids = np.asarray(ids, dtype=np.int64)
    obs = np.full((len(ids), h, w), 87, np.uint8)
    for i, k in enumerate(ids):
        y, x = 10 + k % 60, 5 + (3 * k) % 70
        obs[i, y:y + 6, x:x + 6] = 236
    return {"obs": obs, "action": ids}


class TestWithoutLZ4(unittest.TestCase):
    def test_refused_or_off(self):
        """By default a client asks for uncompressed bodies; compression=True
        without the lz4 package is InvalidArgumentError, before any dial."""
        node = ScriptedNode()
        try:
            with rpc.Client(node.addr, timeout=10) as c:
                self.assertFalse(c.compression)
            if lz4frame is None:
                with self.assertRaises(InvalidArgumentError) as cm:
                    rpc.Client("127.0.0.1:1", compression=True)  # refused before it dials
                self.assertIn("lz4", str(cm.exception))
            else:
                with rpc.Client(node.addr, timeout=10, compression=True) as c:
                    self.assertTrue(c.compression)
        finally:
            node.close()


    def test_unasked_frame_refused(self):
        """A node that sends an LZ4 body to a client that asked for none:
        that call's InternalError, the body skipped, and the next response
        on the connection read right."""
        from test_malformed import valid_response
        value, body = valid_response()
        arg = _msgpack_map(value)
        node = ScriptedNode([(arg, b"\x04\x22\x4d\x18" + b"\x00" * 20, len(body)), (arg, body)])
        try:
            with rpc.Client(node.addr, timeout=10) as c:
                with self.assertRaises(InternalError) as cm:
                    c.call("liar.get", {}, timeout=10, result_tds=("td",))
                self.assertIn("asked for uncompressed", str(cm.exception))
                got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                np.testing.assert_array_equal(got["td"]["x"]["y"], np.ones(2, np.int64))
        finally:
            node.close()


def check(test, td):
    np.testing.assert_array_equal(td["obs"], frames(td["action"])["obs"])


@unittest.skipIf(lz4frame is None, NEEDS_LZ4)
class TestCompression(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.node = Node(buffers=["atari,capacity=512,min-size=1", "sent,capacity=256,min-size=1"]).start()

    @classmethod
    def tearDownClass(cls):
        cls.node.close()

    def sample(self, proxy, compression):
        """Samples 128 rows by bytes through proxy; the bytes that came down."""
        c = rpc.Client(proxy.addr, token=TOKEN, root=self.node.root, compression=compression)
        self.assertEqual(c.compression, compression)
        b = replay.Buffer(c, "atari", bytes_mode=True)
        try:
            if b.stats()["size"] == 0:
                for k in range(4):
                    b.extend(frames(np.arange(k * 128, (k + 1) * 128) + 1))
            _, down = proxy.counts()
            td, _ = b.sample(128)
            check(self, td)
            into = {"obs": np.zeros((128, 84, 84), np.uint8), "action": np.zeros(128, np.int64)}
            b.sample_into(into)  # straight into the caller's arrays, decompressed
            check(self, into)
            _, down2 = proxy.counts()
            return down2 - down
        finally:
            b.close()
            c.close()

    def test_call_responses(self):
        """Samples by bytes (a call's response; new arrays, and the caller's
        with sample_into) come as LZ4 frames, a few times smaller than their
        rows, with every row intact; with compression=False, as they are."""
        raw = 2 * 128 * (84 * 84 + 8)  # two samples
        proxy = CountingProxy(self.node.addr)
        try:
            on = self.sample(proxy, True)
            off = self.sample(proxy, False)
        finally:
            proxy.close()
        self.assertLess(on, raw / 3, f"{on} bytes came down for {raw} of rows: not compressed")
        self.assertGreaterEqual(off, raw, f"{off} bytes came down for {raw} of rows with compression off")

    def test_requests(self):
        """A client with compression sends rows that compress (an extend by
        bytes, a call's request) as an LZ4 frame, a few times smaller, and
        the node stores them intact; rows that do not (random bytes) go as
        they are."""
        proxy = CountingProxy(self.node.addr)
        rng = np.random.default_rng(3)
        try:
            with rpc.Client(proxy.addr, token=TOKEN, root=self.node.root, compression=True) as c, \
                    replay.Buffer(c, "sent", bytes_mode=True) as b:
                noise = rng.integers(0, 256, (128, 84, 84), dtype=np.uint8)
                for name, batch, small in (("frames", frames(np.arange(5000, 5128)), True),
                                           ("random bytes", {"obs": noise, "action": np.arange(6000, 6128)}, False)):
                    with self.subTest(rows=name):
                        raw = sum(v.nbytes for v in batch.values())
                        up, _ = proxy.counts()
                        b.extend(batch)
                        sent = proxy.counts()[0] - up
                        if small:
                            self.assertLess(sent, raw / 3, f"{sent} bytes went up for {raw} of rows: not compressed")
                        else:
                            self.assertGreaterEqual(sent, raw, f"{sent} bytes went up for {raw} of random rows")
                with replay.Buffer(self.node.addr, "sent", token=TOKEN, root=self.node.root) as ref:
                    td, _ = ref.sample(256)
                    f = td["action"] < 6000
                    np.testing.assert_array_equal(td["obs"][f], frames(td["action"][f])["obs"])
                    np.testing.assert_array_equal(td["obs"][~f], noise[td["action"][~f] - 6000])
                    self.assertTrue(f.any() and (~f).any(), "both batches sampled")
        finally:
            proxy.close()

    def test_stream_messages_sent(self):
        """A producer by bytes on a client with compression (a stream's
        messages, sent) publishes every batch as an LZ4 frame, a few times
        smaller, and a consumer gets every sample intact."""
        with Node(extra=["--loader", "train,producer=remote,slots=8,window=8,max-wait=20s"]) as node:
            proxy = CountingProxy(node.addr)
            try:
                batches = [dict(frames(np.arange(k, k + 50)), id=np.arange(k, k + 50)) for k in range(0, 400, 50)]
                c = rpc.Client(proxy.addr, token=TOKEN, root=node.root, compression=True)
                up, _ = proxy.counts()
                p = loader.Producer(c, "train", batches, bytes_mode=True, samples=400).start()
                with loader.Consumer(node.addr, "train", 50, token=TOKEN, root=node.root, timeout=60) as con:
                    seen = []
                    for b in con:
                        np.testing.assert_array_equal(b["obs"], frames(b["id"])["obs"])
                        seen.extend(b["id"].tolist())
                    self.assertEqual(sorted(seen), list(range(400)))
                p.close()
                sent = proxy.counts()[0] - up
                c.close()
            finally:
                proxy.close()
        raw = 400 * (84 * 84 + 16)
        self.assertLess(sent, raw / 3, f"{sent} bytes went up for {raw} of rows: not compressed")

    def test_stream_messages(self):
        """A loader consumer by bytes (a stream's messages) gets every sample
        once, intact, from compressed messages."""
        import os
        import subprocess
        with Node() as node:
            node.stop()
            src = os.path.join(node.dir, "x.npy")
            f = frames(np.arange(400))
            np.save(src, f["obs"])
            ds = os.path.join(node.dir, "ds")
            subprocess.run([binary(), "import", "npy", "obs=" + src, ds], check=True, capture_output=True)
            node.extra = ["--loader", "l,dataset=%s,batch=50,slots=4,seed=5,index=index" % ds]
            node.start()
            proxy = CountingProxy(node.addr)
            try:
                c = rpc.Client(proxy.addr, token=TOKEN, root=node.root, compression=True)
                with loader.Consumer(c, "l", 50, bytes_mode=True) as con:
                    seen = []
                    for b in con:
                        idx = b["index"]
                        np.testing.assert_array_equal(b["obs"], f["obs"][idx])
                        seen.extend(idx.tolist())
                    self.assertEqual(sorted(seen), list(range(400)))
                _, down = proxy.counts()
                c.close()
            finally:
                proxy.close()
        self.assertLess(down, 400 * 84 * 84 / 3, f"{down} bytes came down for an epoch of {400 * 84 * 84}")


def lying_frames():
    """A good compressed response (argument, LZ4 frame, raw_len) and bad
    ones, each a frame that is not one of exactly raw_len bytes."""
    from test_malformed import valid_response
    value, body = valid_response()
    arg, fr = _msgpack_map(value), lz4frame.compress(body)
    good = (arg, fr, len(body))
    bad = [
        (arg, b"\x04\x22\x4d\x18" + b"\xff" * (len(fr) - 4), len(body)),  # corrupt
        (arg, fr[:-6], len(body)),  # ends short
        (arg, lz4frame.compress(body + b"x" * 8), len(body)),  # inflates past raw_len
        (arg, fr + b"zz", len(body)),  # bytes after the frame
    ]
    return good, bad


@unittest.skipIf(lz4frame is None, NEEDS_LZ4)
class TestFrames(unittest.TestCase):
    def test_lying_node(self):
        """Each bad frame is its call's (its recv's) InternalError, and the
        connection (the stream) goes on: the next compressed response is
        read right."""
        good, bad = lying_frames()
        node = ScriptedNode([x for b in bad for x in (b, good)], [good] + [x for b in bad for x in (b, good)])
        try:
            with rpc.Client(node.addr, timeout=10, compression=True) as c:
                for _ in bad:
                    with self.assertRaises(InternalError) as cm:
                        c.call("liar.get", {}, timeout=10, result_tds=("td",))
                    self.assertIn("LZ4", str(cm.exception).upper())
                    got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                    np.testing.assert_array_equal(got["td"]["x"]["y"], np.ones(2, np.int64))
                ms = c.open_stream("liar.watch", {}, timeout=10, result_tds=("td",))
                np.testing.assert_array_equal(ms.recv()["td"]["obs"], np.arange(6, dtype=np.float32).reshape(2, 3))
                for _ in bad:
                    with self.assertRaises(InternalError):
                        ms.recv()
                    np.testing.assert_array_equal(ms.recv()["td"]["x"]["y"], np.ones(2, np.int64))
                with self.assertRaises(rpc.StreamEnd):
                    ms.recv()
                ms.close()
            self.assertEqual(node.responses, [])
        finally:
            node.close()

    def test_limits(self):
        """raw_len past what any frame of body_len bytes inflates to, or past
        the body limit, fails the header (the connection), before anything is
        allocated; within them it parses."""
        ok = _wire.parse_response_header(_msgpack_map({"body_len": 10, "raw_len": 255 * 10 + 1024}))
        self.assertEqual(ok.raw_len, 255 * 10 + 1024)
        for m in ({"body_len": 10, "raw_len": 255 * 10 + 1025}, {"body_len": 1 << 30, "raw_len": _wire.MAX_BODY_BYTES + 1},
                  {"body_len": 10, "raw_len": -1}):
            with self.subTest(m=m), self.assertRaises(_wire.ProtocolError):
                _wire.parse_response_header(_msgpack_map(m))

    def test_decompress(self):
        """One frame of exactly raw_len bytes decodes; a corrupt frame, one
        that ends short, inflates past raw_len, or has bytes after it is
        FrameError."""
        data = bytes(frames(np.arange(8))["obs"])
        fr = lz4frame.compress(data)
        self.assertEqual(_lz4.decompress(fr, len(data)), data)
        for bad, n in ((fr, len(data) - 1), (fr, len(data) + 1), (fr + b"x", len(data)), (fr[:-8], len(data)),
                       (b"\x04\x22\x4d\x18" + b"\xff" * 12, 100)):
            with self.subTest(n=n, tail=bytes(bad[-4:])), self.assertRaises(_lz4.FrameError):
                _lz4.decompress(bad, n)


def _msgpack_map(m):
    from tensorwire import _msgpack
    return _msgpack.packb(m)


if __name__ == "__main__":
    unittest.main()
