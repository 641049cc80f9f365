"""What a node sends that is not the protocol: the client's decoders raise
its own errors (InternalError for a response it cannot use, ProtocolError
inside the handshake and framing, DecodeError from msgpack), never
KeyError, TypeError or AttributeError from their insides, and a bad
response leaves the connection in step for the next call.

The decoders are fuzzed here as Go's are (rpc/fuzz_test.go), with seeded
mutations so that a failure repeats: bytes changed, cut and inserted in
valid messages, and values of a valid response replaced by others of any
type. A node that lies is played by nodes.ScriptedNode, a socket server
speaking protocol version 3 and yamux (docs/protocol.md)."""

import copy
import os
import random
import struct
import unittest

import numpy as np

import tensorwire
from tensorwire import _msgpack, _wire
from tensorwire._td import TD, NonTensorData, build, wire_bytes
from tensorwire.errors import InternalError, TensorwireError
from tensorwire.rpc import _result_tds

from nodes import ScriptedNode

CASES = 3000  # per fuzzed decoder: about a second in all


def mutate(rng, b):
    """b with 1 to 4 random edits: a byte set or flipped, a cut, an insert."""
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        if op < 0.35 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op < 0.5 and b:
            del b[rng.randrange(len(b)):]
        elif op < 0.7:
            i = rng.randrange(len(b) + 1)
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.85 and b:
            i = rng.randrange(len(b))
            del b[i:rng.randrange(i, len(b) + 1)]
        elif b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def valid_response():
    """A response's value with a TensorDict at "td" (nested, non-tensor data
    too) and its body, as a node sends them by bytes."""
    t = TD({"obs": np.arange(6, dtype=np.float32).reshape(2, 3), "x": {"y": np.ones(2, np.int64)},
            "meta": NonTensorData({"a": [1, 2]})})
    t.prepare(None)
    return {"td": t.wire, "n": 3}, b"".join(p.tobytes() for p in t.parts)


def decode_response(raw, body):
    """What Pending._read does with a response's argument and body bytes."""
    value = _msgpack.unpackb(raw)
    rtds = _result_tds(value, ["td"])
    need = sum(wire_bytes(w) for _, _, w in rtds)
    if need != len(body):
        raise InternalError(f"the TensorDicts need {need} body bytes, the body has {len(body)}")
    pos = 0

    def fill(mv):
        nonlocal pos
        mv[:] = body[pos:pos + len(mv)]
        pos += len(mv)

    for parent, k, w in rtds:
        parent[k] = build(w, fill)
    return value


# Values a peer might put anywhere: every msgpack kind, names the decoder
# knows, and JSON nested deeper than Python's recursion limit.
JUNK = [None, True, 0, -1, 1 << 62, -(1 << 63), 2.5, "", "x", b"\xff\xfe", [], [1, -2], [True], {}, {"a": 1},
        ["a"], "torch.float32", "torch.nope", "tensor", "data", "dict", [[1]], [1 << 40, 1 << 40],
        b"[" * 100000, b"{\"a\":", "\ud7ff"]


def paths(v, path=()):
    yield path
    if isinstance(v, dict):
        for k in v:
            yield from paths(v[k], path + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from paths(x, path + (i,))


def replaced(v, path, x):
    if not path:
        return x
    c = v
    for k in path[:-1]:
        c = c[k]
    c[path[-1]] = x
    return v


class TestDecoders(unittest.TestCase):
    def assertOnly(self, errors, fn, arg):
        try:
            fn(arg)
        except errors:
            pass
        except Exception as e:  # noqa: BLE001 - the point of the test
            self.fail(f"{fn.__name__}({arg!r:.300}) raised {type(e).__name__}: {e}")

    def test_response_values_replaced(self):
        """A response's value with 1 to 3 of its parts replaced by junk:
        decoded, or InternalError / DecodeError."""
        rng = random.Random(1)
        value, body = valid_response()
        where = list(paths(value))
        for _ in range(CASES):
            v = copy.deepcopy(value)
            try:
                for _ in range(rng.randint(1, 3)):
                    v = replaced(v, rng.choice(where), copy.deepcopy(rng.choice(JUNK)))
                raw = _msgpack.packb(v)
            except (KeyError, IndexError, TypeError):
                continue  # a path under a part replaced already, made a key of another type
            self.assertOnly((TensorwireError, _msgpack.DecodeError), lambda r: decode_response(r, body), raw)

    def test_response_bytes_mutated(self):
        rng = random.Random(2)
        value, body = valid_response()
        raw = _msgpack.packb(value)
        for _ in range(CASES):
            self.assertOnly((TensorwireError, _msgpack.DecodeError), lambda r: decode_response(r, body),
                            mutate(rng, raw))

    def test_cases_found(self):
        """The cases the fuzzing found, each with the error it gets now."""
        cases = [
            ({"entries": "junk"}, "TD entries: a str"),
            ({"entries": [7]}, "TD entry: a int"),
            ({"entries": [{"key": 5, "kind": "tensor"}]}, "key 5"),
            ({"entries": [{"key": [], "kind": "dict"}]}, "key []"),
            ({"entries": [{"key": ["a"], "kind": "tensor", "dtype": "torch.float32", "shape": 4}]}, "shape 4"),
            ({"entries": [{"key": ["a"], "kind": "tensor", "dtype": "torch.float32", "shape": [-1]}]}, "shape [-1]"),
            ({"entries": [{"key": ["a"], "kind": "tensor", "dtype": "torch.float32", "shape": [True]}]},
             "shape [True]"),
            ({"entries": [{"key": ["a"], "kind": "tensor", "dtype": 3, "shape": [1]}]}, "dtype 3"),
            ({"entries": [{"key": ["a"], "kind": "data", "data": 7}]}, "non-tensor data of type int"),
            ({"entries": [{"key": ["a"], "kind": "data", "data": b"[" * 100000}]}, "non-tensor data"),
            ({"entries": [{"key": ["a"], "kind": "set"}]}, "unknown entry kind"),
            ({"entries": [{"key": ["a"], "kind": "data", "data": b"1"},
                          {"key": ["a", "b"], "kind": "dict"}]}, "is not a dict"),
        ]
        for w, want in cases:
            with self.subTest(w=w):
                with self.assertRaises(InternalError) as cm:
                    decode_response(_msgpack.packb({"td": w}), b"")
                self.assertIn(want, str(cm.exception))
        with self.assertRaises(_msgpack.DecodeError):  # a map as a map's key: msgpack's TypeError
            _msgpack.unpackb(b"\x81\x80\x01")
        with self.assertRaises(_msgpack.DecodeError):
            _msgpack.unpackb(b"\x01\x02")
        # A tensor without a shape is a scalar, as Go writes a nil shape.
        got = decode_response(_msgpack.packb({"td": {"entries": [
            {"key": ["s"], "kind": "tensor", "dtype": "torch.int32"}]}}), struct.pack("<i", 7))
        self.assertEqual(got["td"]["s"].shape, ())
        self.assertEqual(int(got["td"]["s"]), 7)

    def test_headers_and_handshake(self):
        """The framing's parsers: ProtocolError for anything not valid."""
        rng = random.Random(3)
        headers = [_wire.response_header(0, "", "", 10, 20)[4:], _wire.response_header(5, "no", "r")[4:],
                   _wire.stream_end_header(3, "m", "r")[4:], _wire.stream_message_header(3, 4)[4:]]
        hello = _wire.hello(0, os.urandom(32), os.urandom(16))
        session = bytes(40)
        where = _wire.server_where(os.urandom(16), 1, 2, os.urandom(16))
        for fn, seeds in ((_wire.parse_response_header, headers), (_wire.parse_stream_header, headers),
                          (_wire.parse_hello, [hello]), (_wire.parse_session, [session]),
                          (_wire.parse_server_where, [where])):
            for _ in range(CASES // 3):
                self.assertOnly(_wire.ProtocolError, fn, mutate(rng, rng.choice(seeds)))

    def test_sample_info(self):
        """replay's picks from a node: lists of numbers, or InternalError
        (they index this side's mapping after _check_info)."""
        from tensorwire.replay import SampleInfo
        good = SampleInfo._from_wire({"indices": [1, 2], "ids": [3, 4], "weights": [1.0, 0.5]})
        self.assertEqual(good.indices.tolist(), [1, 2])
        for m in [[1], {"indices": ["a"]}, {"indices": [[1, 2]]}, {"ids": [1 << 70]},
                  {"weights": [{}]}, {"indices": [1.5e300]}]:
            with self.subTest(m=m):
                with self.assertRaises(InternalError):
                    SampleInfo._from_wire(m)

    def test_slice_info(self):
        """replay's slices from a node, packed or not: arrays, or
        InternalError (_check_slice_picks then checks their slots)."""
        from tensorwire.replay import SliceInfo
        good = SliceInfo._from_wire({"picks": struct.pack("<qQqQ", 1, 7, -1, 0), "episodes": [3]}, 2)
        self.assertEqual((good.indices.tolist(), good.mask.tolist()), ([1, -1], [True, False]))
        for r in [{"picks": 5}, {"picks": "abcd" * 4}, {"picks": b"x" * 15}, {"picks": b"x" * 16, "pick_weights": 3},
                  {"picks": b"x" * 16, "episodes": ["a"]}, {"info": {"indices": [1]}, "mask": [[True]]},
                  {"info": {"indices": [1]}, "episodes": [[1]]}]:
            with self.subTest(r=r):
                with self.assertRaises(InternalError):
                    SliceInfo._from_wire(r, 1)


class TestDatasetMeta(unittest.TestCase):
    """load_memmap of a folder whose meta.json files had 1 to 3 values
    replaced by junk of any JSON type: loaded, or FormatError /
    UnsupportedError naming the file (Go's FuzzLoadMemmap, as a seeded
    mutation test; nothing escaped it when it was written)."""

    META = {"a": {"device": "cpu", "shape": [2, 3], "dtype": "torch.float32", "is_nested": False},
            "sub": {"type": "TensorDict"}, "shape": [2], "device": None,
            "_type": "<class 'tensordict._td.TensorDict'>"}
    SUB = {"b": {"device": "cpu", "shape": [2, 2], "dtype": "torch.int64", "is_nested": False}, "shape": [2],
           "device": None, "_type": "<class 'tensordict._td.TensorDict'>"}
    JUNK = [None, True, 0, -1, 1 << 70, 2.5, "", "x", [], [1, -2], {}, {"a": 1}, ["a"], "torch.float32", [[1]],
            [2, 3], [1 << 40], "TensorDict", "<class 'tensordict._td.TensorDict'>", "NonTensorData"]

    def test_meta_values_replaced(self):
        import json
        import shutil
        import tempfile
        from tensorwire.dataset import FormatError, UnsupportedError, load_memmap
        rng = random.Random(4)
        root = tempfile.mkdtemp(prefix="tensorwire-pytest-meta-")
        try:
            for i in range(500):
                metas = [copy.deepcopy(self.META), copy.deepcopy(self.SUB)]
                k = rng.randrange(2)
                try:
                    for _ in range(rng.randint(1, 3) if i else 0):  # case 0: as written, loaded
                        metas[k] = replaced(metas[k], rng.choice(list(paths(metas[k]))),
                                            copy.deepcopy(rng.choice(self.JUNK)))
                    texts = [json.dumps(m) for m in metas]
                except (KeyError, IndexError, TypeError):
                    continue
                d = os.path.join(root, str(i))
                os.makedirs(os.path.join(d, "sub"))
                np.arange(6, dtype=np.float32).tofile(os.path.join(d, "a.memmap"))
                np.arange(4, dtype=np.int64).tofile(os.path.join(d, "sub", "b.memmap"))
                for sub, text in zip(("", "sub"), texts):
                    with open(os.path.join(d, sub, "meta.json"), "w") as f:
                        f.write(text)
                if i == 0:
                    np.testing.assert_array_equal(load_memmap(d)["sub"]["b"], np.arange(4).reshape(2, 2))
                self.assertOnly((FormatError, UnsupportedError), load_memmap, d)
                shutil.rmtree(d)
        finally:
            shutil.rmtree(root)

    assertOnly = TestDecoders.assertOnly


class TestLyingRPCNode(unittest.TestCase):
    def test_bad_responses_then_a_good_one(self):
        """Each bad response is the call's InternalError; the stream stays in
        step (its body skipped), so the next call on the same connection
        gets its own response."""
        value, body = valid_response()
        good = (_msgpack.packb(value), body)
        bad = [
            (_msgpack.packb({"td": {"entries": "junk"}}), b"12345678"),
            (_msgpack.packb({"td": {"entries": [{"key": ["a"], "kind": "tensor", "dtype": "torch.int8",
                                                 "shape": [3]}]}}), b"1234"),  # 3 bytes described, 4 sent
            (b"\x81\x80\x01", b"abc"),  # not msgpack a dict can hold
            (b"\xc1", b""),  # not msgpack at all
        ]
        node = ScriptedNode([x for b in bad for x in (b, good)])
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                for arg, _ in bad:
                    with self.assertRaises(InternalError) as cm:
                        c.call("liar.get", {}, timeout=10, result_tds=("td",))
                    self.assertIn("liar.get: response", str(cm.exception))
                    got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                    np.testing.assert_array_equal(got["td"]["obs"], np.arange(6, dtype=np.float32).reshape(2, 3))
                    np.testing.assert_array_equal(got["td"]["x"]["y"], np.ones(2, np.int64))
                    self.assertEqual(got["td"]["meta"], NonTensorData({"a": [1, 2]}))
                    self.assertEqual(got["n"], 3)
            self.assertEqual(node.responses, [])
        finally:
            node.close()

    def test_bad_message_in_a_stream(self):
        """A message the client cannot decode is that recv's InternalError;
        the stream goes on with the next message, and to its end."""
        value, body = valid_response()
        good = (_msgpack.packb(value), body)
        bad = [(_msgpack.packb({"td": {"entries": [{"key": ["a"], "kind": "tensor", "dtype": "torch.nope",
                                                    "shape": [2]}]}}), b"12345678"),
               (b"\x81\x80\x01", b"abc")]
        node = ScriptedNode([], [good, bad[0], good, bad[1], good])
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                ms = c.open_stream("liar.watch", {}, timeout=10, result_tds=("td",))
                for want_good in (True, False, True, False, True):
                    if want_good:
                        got = ms.recv()
                        np.testing.assert_array_equal(got["td"]["x"]["y"], np.ones(2, np.int64))
                    else:
                        with self.assertRaises(InternalError) as cm:
                            ms.recv()
                        self.assertIn("liar.watch", str(cm.exception))
                with self.assertRaises(tensorwire.rpc.StreamEnd):
                    ms.recv()
                ms.close()
        finally:
            node.close()

    def test_bad_message_body_read_after_part_of_it(self):
        """A message whose TensorDict fails to be made (non-tensor data that
        is not JSON, or a key that runs through a tensor) once a tensor
        before it took part of the body is that recv's InternalError, and
        the stream goes on with the next message: the rest of its body is
        skipped. Before the fix that rest was read as the next frame's
        header, which failed the whole connection (UnavailableError)."""
        tensor = {"key": ["x"], "kind": "tensor", "dtype": "torch.uint8", "shape": [8], "ref": None, "data": None}
        bad_tds = [
            [tensor, {"key": ["m"], "kind": "data", "dtype": "", "shape": None, "ref": None, "data": b"{"},
             dict(tensor, key=["y"])],
            [tensor, dict(tensor, key=["x", "z"]), dict(tensor, key=["y"])],
        ]
        t = TD({"x": np.arange(8, dtype=np.uint8)})
        t.prepare(None)
        good = (_msgpack.packb({"td": t.wire}), t.parts[0].tobytes())
        for entries in bad_tds:
            with self.subTest(entries=entries):
                td = {"batch": [8], "rows": None, "gathered": False, "out": False, "entries": entries}
                bad = (_msgpack.packb({"td": td}), b"\xff" * 8 * sum(e["kind"] == "tensor" for e in entries))
                node = ScriptedNode([], [bad, good])
                try:
                    with tensorwire.Client(node.addr, timeout=10) as c:
                        ms = c.open_stream("liar.watch", {}, timeout=10, result_tds=("td",))
                        with self.assertRaises(InternalError) as cm:
                            ms.recv()
                        got = ms.recv()
                        np.testing.assert_array_equal(got["td"]["x"], np.arange(8, dtype=np.uint8))
                        with self.assertRaises(tensorwire.rpc.StreamEnd):
                            ms.recv()
                        ms.close()
                        self.assertIn("liar.watch", str(cm.exception))
                finally:
                    node.close()

    def test_empty_tensor_with_a_huge_dimension(self):
        """A TensorDict with a tensor no array can have, though its bytes
        pass the body's length check (a zero dimension beside one past
        numpy's limit, or non-zero dimensions of more bytes than it allows
        beside a zero one), is the call's InternalError, as other bad
        TensorDicts are, every time result() is asked, and the next call
        gets its own response. Before the fix it was numpy's ValueError
        from np.empty, and a second result() returned None."""
        value, body = valid_response()
        good = (_msgpack.packb(value), body)
        for shape in ([0, 1 << 63], [0, (1 << 64) - 1], [1 << 62, 0, 4]):
            with self.subTest(shape=shape):
                td = {"batch": [0], "rows": None, "gathered": False, "out": False,
                      "entries": [{"key": ["x"], "kind": "tensor", "dtype": "torch.uint8", "shape": shape,
                                   "ref": None, "data": None}]}
                node = ScriptedNode([(_msgpack.packb({"td": td}), b""), good])
                try:
                    with tensorwire.Client(node.addr, timeout=10) as c:
                        p = c.start("liar.get", {}, timeout=10, result_tds=("td",))
                        with self.assertRaises(InternalError) as cm:
                            p.result()
                        self.assertIn("shape", str(cm.exception))
                        with self.assertRaises(InternalError):
                            p.result()
                        got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                        self.assertEqual(got["n"], 3)
                finally:
                    node.close()

    def test_result_raises_its_error_again(self):
        """Pending.result() raises the first one's error every time it is
        asked, an error that is not a TensorwireError (a bug's) too. Before
        the fix a second result() returned None."""
        from unittest import mock
        value, body = valid_response()
        node = ScriptedNode([(_msgpack.packb(value), body), (_msgpack.packb(value), body)])
        try:
            with tensorwire.Client(node.addr, timeout=10) as c:
                p = c.start("liar.get", {}, timeout=10, result_tds=("td",))
                with mock.patch("tensorwire.rpc.build", side_effect=ValueError("a bug")):
                    with self.assertRaises(ValueError):
                        p.result()
                with self.assertRaises(ValueError):
                    p.result()
                got = c.call("liar.get", {}, timeout=10, result_tds=("td",))
                self.assertEqual(got["n"], 3)
        finally:
            node.close()


def loader_join(**change):
    """A producer's answer to join: 4 samples of float32 rows of 3 in
    batches of 4, a ring of 2 slots."""
    info = {"ring": "r1", "consumer": 1, "epoch": 0, "prefix": "", "samples": 4, "batch": 4, "slots": 2,
            "heartbeat_ms": 5000, "schema": [{"key": ["x"], "dtype": "torch.float32", "shape": [3]}]}
    info.update(change)
    return _msgpack.packb(info), b""


def loader_batch(data=None, **change):
    """Batch 0 of epoch 0 announced, with its rows, data (bytes mode)."""
    a = {"epoch": 0, "index": 0, "count": 1, "slot": 1, "word": 5 << 2 | 2, "rows": 4}
    a.update(change)
    t = TD(data if data is not None else {"x": np.arange(12, dtype=np.float32).reshape(4, 3)})
    t.prepare(None)
    return _msgpack.packb({"batch": a, "rows": t.wire}), b"".join(p.tobytes() for p in t.parts)


class TestLyingLoaderNode(unittest.TestCase):
    """A loader consumer (bytes mode) given a join answer, announcements or
    rows no producer sends: InternalError naming what is wrong, never a
    batch of other rows (as Go's TestConsumer_BadJoinResponse,
    _BadAnnouncement and _BadRows)."""

    def consume(self, join, batch=None):
        node = ScriptedNode([join], [] if batch is None else [batch])
        try:
            with tensorwire.loader.Consumer(node.addr, "liar", 4, timeout=10, as_torch=False) as c:
                return next(iter(c))
        finally:
            node.close()

    def test_a_good_batch(self):
        got = self.consume(loader_join(), loader_batch())
        np.testing.assert_array_equal(got["x"], np.arange(12, dtype=np.float32).reshape(4, 3))

    def test_bad_join(self):
        for change, want in [({"slots": -3}, "a ring of -3 slots"), ({"slots": 1 << 40}, "slots of 4 rows"),
                             ({"batch": 0}, "slots of 0 rows"), ({"slots": 1, "batch": 2}, "for a consumer of batch 4"),
                             ({"samples": 0}, "0 samples"), ({"epoch": -1}, "epoch -1"),
                             ({"heartbeat_ms": -5}, "heartbeat of -5"), ({"slots": "2"}, "slots '2'"),
                             ({"schema": [{"key": ["x"], "dtype": "torch.nope"}]}, "schema field"),
                             ({"schema": [{"key": ["x"], "dtype": "torch.int8", "shape": [-1]}]}, "schema field"),
                             ({"schema": "x"}, "schema 'x'"), ({"ring": 7}, "ring 7")]:
            with self.subTest(change=change):
                with self.assertRaises(InternalError) as cm:
                    self.consume(loader_join(**change))
                self.assertIn(want, str(cm.exception))

    def test_bad_announcement(self):
        for change in [{"slot": -2}, {"slot": 2}, {"slot": 1 << 62}, {"count": 2}, {"rows": 3},
                       {"word": 5 << 2 | 1}, {"word": "w"}]:
            with self.subTest(change=change):
                with self.assertRaises(InternalError) as cm:
                    self.consume(loader_join(), loader_batch(**change))
                self.assertIn("loader: the node announced batch 0 of epoch 0", str(cm.exception))

    def test_bad_rows(self):
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        for rows in [{"y": x}, {"x": x, "y": x}, {"x": x[:, :1]}, {"x": x[:3]}, {"x": x.astype(np.float64)},
                     {"x": {"z": x}}]:
            with self.subTest(rows=list(rows)):
                with self.assertRaises(InternalError) as cm:
                    self.consume(loader_join(), loader_batch(rows))
                self.assertIn("are not the joined schema's", str(cm.exception))


class TestLyingProducerNode(unittest.TestCase):
    """A Python Producer (bytes mode) attached or granted what no node sends:
    InternalError, told to the node, before a batch is written (by
    reference a slot outside the ring would write over another slot's
    batch)."""

    def produce(self, attached, grant):
        msgs = [(_msgpack.packb({"attached": attached}), b"")]
        if grant is not None:
            msgs.append((_msgpack.packb({"grant": grant}), b""))
        node = ScriptedNode([], msgs)
        try:
            p = tensorwire.loader.Producer(node.addr, "liar", [{"x": np.zeros((4, 3), np.float32)}], samples=4,
                                           reattach=False, timeout=10)
            try:
                p.run()
            except Exception as e:  # noqa: BLE001 - returned for the test to judge
                return p, e
            finally:
                p.close()
            return p, None
        finally:
            node.close()

    ATTACHED = {"ring": "r1", "prefix": "", "slots": 2, "epoch": 0}
    GRANT = {"epoch": 0, "index": 0, "count": 1, "slot": 1, "rows": 4}

    def test_a_good_grant(self):
        p, err = self.produce(self.ATTACHED, self.GRANT)
        self.assertEqual(p.published, 1)
        # The script's end: the node ends the stream.
        self.assertIsInstance(err, tensorwire.errors.UnavailableError)
        self.assertIn("ended the producer's stream", str(err))

    def test_bad_attachment(self):
        for change in [{"slots": 0}, {"slots": -1}, {"slots": 1 << 40}, {"slots": "2"}, {"ring": 3}]:
            with self.subTest(change=change):
                p, err = self.produce({**self.ATTACHED, **change}, None)
                self.assertIsInstance(err, InternalError)
                self.assertIn("the node attached the producer as", str(err))

    def test_bad_grant(self):
        for change, want in [({"slot": -1}, "slot -1 of a ring of 2"), ({"slot": 2}, "slot 2 of a ring of 2"),
                             ({"rows": 5}, "5 rows for batches of 4"), ({"rows": 0}, "0 rows"),
                             ({"index": 1}, "batch 1 of 1"), ({"epoch": -1}, "epoch -1"),
                             ({"slot": None}, "not a grant")]:
            with self.subTest(change=change):
                p, err = self.produce(self.ATTACHED, {**self.GRANT, **change})
                self.assertIsInstance(err, InternalError)
                self.assertIn(want, str(err))
                self.assertEqual(p.published, 0)


class TestLyingSidecar(unittest.TestCase):
    """A "sidecar" that is another program (a TENSORWIRE_BIN of the wrong
    kind, say) answering the join with what is not a frame: PeerLostError
    saying what came, its process stopped, never a ValueError from msgpack
    or a pipe left out of step."""

    def test_not_a_frame(self):
        import sys
        import tempfile
        import time
        from tensorwire import collective
        for reply, want in [(struct.pack(">I", 5) + b"\xc1" * 5, "not msgpack"),
                            (struct.pack(">I", 1) + b"\x01", "not a map"),
                            (struct.pack(">I", 1 << 24), "a reply of 16777216 bytes")]:
            with self.subTest(want=want), tempfile.TemporaryDirectory() as d:
                fake = os.path.join(d, "tensorwire")
                with open(fake, "w") as f:
                    f.write(f"#!{sys.executable}\nimport os, sys, time\n"
                            "open(os.path.join(os.path.dirname(sys.argv[0]), 'pid'), 'w').write(str(os.getpid()))\n"
                            f"os.write(1, {reply!r})\ntime.sleep(60)\n")
                os.chmod(fake, 0o755)
                t0 = time.monotonic()
                with self.assertRaises(collective.PeerLostError) as cm:
                    collective.join("127.0.0.1:1", 0, 1, binary=fake, timeout=30)
                self.assertIn(want, str(cm.exception))
                self.assertLess(time.monotonic() - t0, 20)  # not the fake's 60 s sleep
                pid = int(open(os.path.join(d, "pid")).read())
                with self.assertRaises(ProcessLookupError):  # stopped and reaped
                    os.kill(pid, 0)


class TestLyingStoreNode(unittest.TestCase):
    """A store client given answers no node sends: InternalError, never a
    KeyError or AttributeError from inside it, and no file opened outside
    the store's values."""

    def call(self, answer, fn):
        from tensorwire import store
        node = ScriptedNode([(_msgpack.packb({"dir": "stores/s"}), b""), (_msgpack.packb(answer), b"")])
        try:
            with store.Store(node.addr, "s", timeout=10) as st:
                return fn(st)
        finally:
            node.close()

    def test_a_good_answer(self):
        self.assertEqual(self.call({"rev": 3}, lambda st: st.put("b", {"x": np.ones(2)})), 3)

    def watch(self, *messages):
        from tensorwire import store
        node = ScriptedNode([(_msgpack.packb({"dir": "stores/s"}), b"")],
                            [(_msgpack.packb(m), b"") for m in messages])
        try:
            with store.Store(node.addr, "s", timeout=10) as st, st.watch(timeout=10) as w:
                return [next(w) for _ in messages]
        finally:
            node.close()

    def test_watch(self):
        ev = {"rev": 4, "op": 1, "name": "b", "items": 1, "version": 0}
        self.assertEqual([tuple(e) for e in self.watch({"events": [ev], "seen": 4})], [(4, "put", "b", 1, 0)])
        for m in [{"events": [{**ev, "rev": "4"}]}, {"events": [{**ev, "name": 5}]}, {"events": "x"},
                  {"events": [ev], "seen": -1}, {"events": [7]}, [ev]]:
            with self.subTest(m=m):
                with self.assertRaises(InternalError):
                    self.watch(m)

    def test_lease_renewal_goes_on(self):
        """A renewal answered with what no node sends is skipped like a
        failed one: the renewals go on, and a lease the node later says
        lost is marked lost (the thread used to die on it, silently)."""
        import threading
        import time
        from tensorwire import store
        node = ScriptedNode([(_msgpack.packb({"dir": "stores/s"}), b"")])
        try:
            with store.Store(node.addr, "s", timeout=10) as st:
                answers = [[1], {"lost": "x"}, {"lost": [{}]}, {"lost": [5]}]
                st._client.call = lambda method, arg, timeout=None, result_tds=(): answers.pop(0) if answers else {}
                p = store.Param(st, "p", 1, {}, 5)
                st._params.add(p)
                threading.Thread(target=st._renew, args=(30,), daemon=True).start()
                deadline = time.monotonic() + 10
                while p.err is None and time.monotonic() < deadline:
                    time.sleep(0.01)
                self.assertIsInstance(p.err, store.ExpiredError)
                st._params.discard(p)
        finally:
            node.close()

    def test_bad_answers(self):
        put = lambda st: st.put("b", {"x": np.ones(2)})  # noqa: E731
        peek = lambda st: st.peek("b")  # noqa: E731
        for answer, fn in [({"rev": "3"}, put), ({"rev": -1}, put), ({}, put), ([3], put), (7, put),
                           ({"take": 0, "items": "x"}, peek), ({"take": 0, "items": [5]}, peek),
                           ({"take": 0, "items": [{"path": "../../etc/passwd"}]}, peek),
                           ({"take": 0, "items": [{"path": 5}]}, peek),
                           ({"bins": [1, 2], "rev": 1}, lambda st: st.list()),
                           ({"rev": None}, lambda st: st.delete("b")),
                           ({"version": "1", "td": None, "path": "values/v1"}, lambda st: st.latest("p")),
                           ({"version": 1, "td": None, "path": "values/v1"}, lambda st: st.latest("p"))]:
            with self.subTest(answer=answer):
                with self.assertRaises(InternalError):
                    self.call(answer, fn)


class TestLyingReplayNode(unittest.TestCase):
    """A replay client (bytes mode) given a description, a reservation or a
    commit's answer no node sends: InternalError, and no row written."""

    INFO = {"id": "b1", "prefix": "", "capacity": 8, "lease_ms": 5000, "sampler": "uniform",
            "writer": {"kind": "round_robin"},
            "schema": [{"key": ["x"], "dtype": "torch.float32", "shape": [2]}]}

    def extend(self, info, *answers):
        from tensorwire import replay
        node = ScriptedNode([(_msgpack.packb(a), b"") for a in (info,) + answers])
        try:
            with replay.Buffer(node.addr, "b", timeout=10) as buf:
                return buf.extend({"x": np.ones((2, 2), np.float32)}, timeout=10)
        finally:
            node.close()

    def test_a_good_extend(self):
        got = self.extend(self.INFO, {"id": "b1", "rid": 9, "slots": [3, 4]}, {"indices": [3, 4]})
        self.assertEqual(got.tolist(), [3, 4])

    def test_bad_description(self):
        for change in [{"capacity": "8"}, {"capacity": -1}, {"writer": "top_k"}, {"lease_ms": "5"},
                       {"id": 3}, {"schema": [{"key": ["x"], "dtype": "torch.nope"}]}, {"resample_all": "yes"}]:
            with self.subTest(change=change):
                with self.assertRaises(InternalError):
                    self.extend({**self.INFO, **change})
        with self.assertRaises(InternalError):
            self.extend([1, 2])

    def test_bad_reservation(self):
        for reserve in [{"id": "b1", "rid": "9", "slots": [3, 4]}, {"id": "b1", "rid": 9, "slots": "ab"},
                        {"id": "b1", "rid": 9, "slots": [3]}, {"id": "b1", "rid": 9, "slots": [3, 1.5]},
                        {"id": "b1", "rid": 9, "slots": [3, -3]}, [3, 4]]:
            with self.subTest(reserve=reserve):
                with self.assertRaises(InternalError):
                    self.extend(self.INFO, reserve, {"indices": [3, 4]})
        for commit in [{"indices": [3]}, {"indices": ["3", 4]}, {"indices": 3}, {"indices": [3, -2]}]:
            with self.subTest(commit=commit):
                with self.assertRaises(InternalError):
                    self.extend(self.INFO, {"id": "b1", "rid": 9, "slots": [3, 4]}, commit)


class TestLyingServeNode(unittest.TestCase):
    """A serve client (bytes mode) given a model description or a prediction
    no node sends: InternalError."""

    INFO = {"name": "m", "input": [{"key": ["x"], "dtype": "torch.float32", "shape": [2]}],
            "output": [{"key": ["y"], "dtype": "torch.float32", "shape": [2]}], "max_batch": 4}

    def predict(self, info, answer=None):
        from tensorwire import serve
        answers = [(_msgpack.packb(info), b"")]
        if answer is not None:
            answers.append(answer)
        node = ScriptedNode(answers)
        try:
            with serve.Client(node.addr, "m", timeout=10) as c:
                return c.predict({"x": np.ones((1, 2), np.float32)}, timeout=10, return_version=True)
        finally:
            node.close()

    @staticmethod
    def answer(version):
        t = TD({"y": np.full((1, 2), 3, np.float32)})
        t.prepare(None)
        return _msgpack.packb({"version": version, "out": t.wire}), t.parts[0].tobytes()

    def test_a_good_prediction(self):
        out, version = self.predict(self.INFO, self.answer(5))
        self.assertEqual(version, 5)
        np.testing.assert_array_equal(out["y"], np.full((1, 2), 3, np.float32))

    def test_bad_answers(self):
        for info, answer in [({**self.INFO, "max_batch": "4"}, None), ([1], None),
                             (self.INFO, self.answer("5")), (self.INFO, self.answer(-1)),
                             (self.INFO, (_msgpack.packb([1]), b""))]:
            with self.subTest(info=info, answer=answer):
                with self.assertRaises(InternalError):
                    self.predict(info, answer)


def _have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(_have_torch(), "needs torch (a replica runs a torch module)")
class TestLyingReplicaNode(unittest.TestCase):
    """A Python serve replica (bytes mode) given a model description or a
    batch no node sends: InternalError (a bad batch: the stream given up,
    as a detachment), never a ValueError from inside the replica."""

    INFO = {"name": "m", "input": [{"key": ["x"], "dtype": "torch.float32", "shape": [2]}],
            "output": [{"key": ["y"], "dtype": "torch.float32", "shape": [2]}], "max_batch": 4}

    def replica(self, info, messages=()):
        import torch
        from tensorwire import replica as _replica
        node = ScriptedNode([(_msgpack.packb(info), b"")],
                            [m if isinstance(m, tuple) else (_msgpack.packb(m), b"") for m in messages])
        try:
            r = _replica.Replica(node.addr, "m", torch.nn.Identity(), reattach=False, timeout=10)
            try:
                r.run()
            finally:
                r.close()
            return r
        finally:
            node.close()

    def test_a_good_batch(self):
        t = TD({"x": np.ones((1, 2), np.float32)})
        t.prepare(None)
        msg = (_msgpack.packb({"batch": 7, "n": 1, "row": None, "in": t.wire}), t.parts[0].tobytes())
        r = self.replica(self.INFO, [msg])  # the script's end: the stream ends, run returns
        self.assertEqual(r.batches, 1)

    def test_follower_does_not_spin(self):
        """Weights followed from a store that fails at once (its node sends
        what no node sends): the follower asks again after a pause, not in
        a loop that spins on the node."""
        import time
        import torch
        from tensorwire import replica as _replica
        from tensorwire import store

        class FailingStore:
            calls = 0

            def latest(self, name):
                raise store.NotFoundError("none yet")

            def wait_newer(self, name, version, timeout=None):
                FailingStore.calls += 1
                raise InternalError("store: the node's answer has version '1'")

        node = ScriptedNode([(_msgpack.packb(self.INFO), b"")])
        try:
            r = _replica.Replica(node.addr, "m", torch.nn.Identity(), reattach=False, timeout=10,
                                 follow=(FailingStore(), "w"))
            try:
                time.sleep(1.0)
                self.assertLessEqual(FailingStore.calls, 10)
                self.assertGreaterEqual(FailingStore.calls, 1)
            finally:
                r.close()
        finally:
            node.close()

    def test_bad_description(self):
        for change in [{"max_batch": "4"}, {"max_batch": 0}, {"input": [{"key": "x"}]}]:
            with self.subTest(change=change):
                with self.assertRaises(InternalError):
                    self.replica({**self.INFO, **change})

    def test_bad_batch(self):
        for msg in [{"batch": "7", "n": 1}, {"batch": 7, "n": 1.5}, {"batch": 7, "n": 1, "row": "0"}, [1, 2]]:
            with self.subTest(msg=msg):
                with self.assertRaises(InternalError) as cm:
                    self.replica(self.INFO, [msg])
                self.assertIn("for a batch", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
